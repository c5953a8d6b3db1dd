#pragma once
// Turns committed tokens into text that is safe to send now: always valid UTF-8 (through the
// IncrementalDecoder), never past a stop string. With stop strings, the last
// max_stop_length − 1 bytes are held back, since they may be the start of a stop string that
// the next tokens complete. Streamed and non-streamed responses both go through it, so their
// texts agree by construction.
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace dflash::server {

class TextStream {
 public:
  // Special tokens (end of sequence) are not part of the text.
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stops);

  // Text that became safe with these tokens (possibly empty).
  std::string push(const int32_t* ids, size_t n);
  // The rest, once generation ended: undecodable trailing bytes as U+FFFD, cut at a stop.
  std::string finish();
  bool stopped() const { return match_ != std::string::npos; }
  // Everything sent so far, for the non-streamed response.
  std::string sent_text() const { return text_.substr(0, sent_); }

 private:
  void find_stop(size_t new_from);
  IncrementalDecoder decoder_;
  std::vector<std::string> stops_;
  size_t max_stop_ = 0;
  std::string text_;  // all decoded text
  size_t sent_ = 0;
  size_t match_ = std::string::npos;
};

}  // namespace dflash::server
