#include "engine/stop_strings.h"

#include <algorithm>

namespace dflash {

StopStringMatcher::StopStringMatcher(const Tokenizer& tokenizer, std::vector<std::string> stops)
    : decoder_(tokenizer), stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
  for (const auto& s : stops_) max_stop_ = std::max(max_stop_, s.size());
}

bool StopStringMatcher::update(const std::vector<int32_t>& output) {
  if (matched()) return true;
  const size_t before = text_.size();
  for (; seen_tokens_ < output.size(); ++seen_tokens_) text_ += decoder_.push(output[seen_tokens_]);
  // A new match must end in the new text, so it starts at most max_stop_ − 1 bytes earlier.
  const size_t from = before >= max_stop_ ? before - max_stop_ + 1 : 0;
  for (const auto& s : stops_) {
    const size_t p = text_.find(s, from);
    if (p != std::string::npos) match_pos_ = std::min(match_pos_, p);
  }
  return matched();
}

std::string StopStringMatcher::text() const {
  return matched() ? text_.substr(0, match_pos_) : text_;
}

}  // namespace dflash
