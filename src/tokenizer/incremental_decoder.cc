#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace dflash {

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

std::string IncrementalDecoder::push(int32_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  pending_ += tokenizer_->token_bytes(id);
  // Lossy conversion restarts cleanly at a character boundary, so converting the stable
  // prefix now gives exactly what converting everything at the end would.
  const size_t n = utf8::stable_prefix(pending_);
  std::string out = utf8::lossy(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out = utf8::lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace dflash
