#pragma once
// HF pre-tokenizers for byte-level BPE: Split (regex or literal, all split behaviors),
// ByteLevel (optional GPT-2 regex and prefix space; the byte mapping itself is folded into
// the model) and Sequence.
#include <deque>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace dflash {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits each piece of `pieces` further, in place. Pieces that need new text (a prefix
  // space) are stored in `arena`, whose elements never move.
  virtual void split(std::vector<std::string_view>& pieces, std::deque<std::string>& arena) const = 0;
  static std::unique_ptr<PreTokenizer> from_json(const nlohmann::json& config,
                                                 const std::string& where);
};

}  // namespace dflash
