#pragma once
// HF "added tokens": strings matched in the input before normalization/pre-tokenization
// (leftmost-longest), with lstrip/rstrip/single_word handling. Tokens with normalized=true
// are matched again after normalization, against their normalized content.
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace dflash {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// A piece of input: either an added token (id >= 0) or text still to be tokenized.
struct Segment {
  size_t begin, end;
  int32_t id;
};

class AddedTokenMatcher {
 public:
  // `patterns[i]` is what token `tokens[i]` is matched as.
  void build(const std::vector<const AddedToken*>& tokens, const std::vector<std::string>& patterns);
  bool empty() const { return tokens_.empty(); }
  // Splits `text` into segments. Special tokens are skipped (left as text) unless parse_special.
  void split(std::string_view text, bool parse_special, std::vector<Segment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                       // index into tokens_
  };
  int32_t child(int32_t node, unsigned char c) const;
  std::vector<Node> nodes_;
  std::vector<const AddedToken*> tokens_;
  bool first_byte_[256] = {};
};

}  // namespace dflash
