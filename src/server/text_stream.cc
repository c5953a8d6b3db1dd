#include "server/text_stream.h"

#include <algorithm>

namespace dflash::server {

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stops)
    : decoder_(tokenizer, /*skip_special_tokens=*/true), stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
  for (const auto& s : stops_) max_stop_ = std::max(max_stop_, s.size());
}

void TextStream::find_stop(size_t new_from) {
  // A new match ends in the new text, so it starts at most max_stop_ − 1 bytes before it.
  const size_t from = new_from + 1 > max_stop_ ? new_from + 1 - max_stop_ : 0;
  for (const auto& s : stops_) {
    const size_t p = text_.find(s, from);
    if (p != std::string::npos) match_ = std::min(match_, p);
  }
}

std::string TextStream::push(const int32_t* ids, size_t n) {
  if (stopped()) return {};
  const size_t before = text_.size();
  for (size_t i = 0; i < n; ++i) text_ += decoder_.push(ids[i]);
  if (max_stop_ == 0) {
    std::string out = text_.substr(sent_);
    sent_ = text_.size();
    return out;
  }
  find_stop(before);
  size_t safe = stopped() ? match_ : (text_.size() >= max_stop_ - 1 ? text_.size() - (max_stop_ - 1) : 0);
  // Never split a character: back up to the start of one.
  while (safe > sent_ && safe < text_.size() && (static_cast<unsigned char>(text_[safe]) & 0xC0) == 0x80) --safe;
  if (safe <= sent_) return {};
  std::string out = text_.substr(sent_, safe - sent_);
  sent_ = safe;
  return out;
}

std::string TextStream::finish() {
  if (!stopped()) {
    const size_t before = text_.size();
    text_ += decoder_.flush();
    if (max_stop_ > 0) find_stop(before);
  }
  const size_t end = stopped() ? match_ : text_.size();
  std::string out = end > sent_ ? text_.substr(sent_, end - sent_) : std::string();
  sent_ = std::max(sent_, end);
  return out;
}

}  // namespace dflash::server
