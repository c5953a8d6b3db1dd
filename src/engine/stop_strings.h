#pragma once
// Stop strings are matched on decoded text, not on tokens: a stop string may span several
// tokens or end inside one. The matcher decodes incrementally, so each commit costs only the
// new tokens.
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace dflash {

class StopStringMatcher {
 public:
  StopStringMatcher(const Tokenizer& tokenizer, std::vector<std::string> stops);

  // Feeds the output so far (only tokens past those already seen are decoded); true once
  // any stop string appears in the text.
  bool update(const std::vector<int32_t>& output);
  // The decoded text, cut before the first stop string when one matched.
  std::string text() const;
  bool matched() const { return match_pos_ != std::string::npos; }

 private:
  IncrementalDecoder decoder_;
  std::vector<std::string> stops_;
  size_t max_stop_ = 0;
  size_t seen_tokens_ = 0;
  std::string text_;
  size_t match_pos_ = std::string::npos;
};

}  // namespace dflash
