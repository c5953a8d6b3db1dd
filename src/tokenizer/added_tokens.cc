#include "tokenizer/added_tokens.h"

#include <utf8proc.h>

#include <algorithm>

#include "tokenizer/utf8.h"

namespace dflash {
namespace {

// Rust's char::is_whitespace (the White_Space property).
bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Close to Rust's char::is_alphanumeric (letters and numbers).
bool is_alphanumeric(char32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

char32_t last_char(std::string_view s, size_t* start) {
  size_t i = s.size();
  do --i;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80);
  *start = i;
  size_t j = i;
  return utf8::next_code_point(s, j);
}

}  // namespace

void AddedTokenMatcher::build(const std::vector<const AddedToken*>& tokens,
                              const std::vector<std::string>& patterns) {
  tokens_ = tokens;
  nodes_.assign(1, Node{});
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::string& p = patterns[t];
    if (p.empty()) continue;
    first_byte_[static_cast<unsigned char>(p[0])] = true;
    int32_t node = 0;
    for (unsigned char c : p) {
      int32_t next = child(node, c);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.push_back(Node{});
        auto& ch = nodes_[node].children;
        ch.insert(std::lower_bound(ch.begin(), ch.end(), std::make_pair(c, int32_t{-1})),
                  {c, next});
      }
      node = next;
    }
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<int32_t>(t);
  }
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char c) const {
  const auto& ch = nodes_[node].children;
  auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(c, int32_t{-1}));
  return it != ch.end() && it->first == c ? it->second : -1;
}

void AddedTokenMatcher::split(std::string_view text, bool parse_special,
                              std::vector<Segment>& out) const {
  size_t emitted = 0;  // end of the last segment pushed
  size_t pos = 0;
  while (pos < text.size()) {
    // Leftmost-longest: the first position with any match, the longest match there.
    size_t mstart = text.size(), mend = 0;
    int32_t tok = -1;
    for (size_t i = pos; i < text.size() && tok < 0; ++i) {
      if (!first_byte_[static_cast<unsigned char>(text[i])]) continue;
      int32_t node = 0;
      for (size_t j = i; j < text.size(); ++j) {
        node = child(node, static_cast<unsigned char>(text[j]));
        if (node < 0) break;
        if (nodes_[node].token >= 0) {
          tok = nodes_[node].token;
          mstart = i;
          mend = j + 1;
        }
      }
    }
    if (tok < 0) break;
    pos = mend;
    const AddedToken& t = *tokens_[tok];
    if (t.special && !parse_special) continue;
    size_t start = mstart, stop = mend;
    if (t.single_word) {
      size_t ci;
      const bool start_space = start == 0 || !is_alphanumeric(last_char(text.substr(0, start), &ci));
      size_t k = stop;
      const bool stop_space = stop == text.size() || !is_alphanumeric(utf8::next_code_point(text, k));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t s = start;
      while (s > 0) {
        size_t ci;
        if (!is_whitespace(last_char(text.substr(0, s), &ci))) break;
        s = ci;
      }
      start = std::max(s, emitted);  // an earlier token may already have taken the spaces
    }
    if (t.rstrip) {
      size_t k = stop;
      while (k < text.size()) {
        size_t next = k;
        if (!is_whitespace(utf8::next_code_point(text, next))) break;
        k = next;
      }
      stop = k;
      pos = std::max(pos, stop);
    }
    if (emitted < start) out.push_back({emitted, start, -1});
    out.push_back({start, stop, t.id});
    emitted = stop;
  }
  if (emitted < text.size()) out.push_back({emitted, text.size(), -1});
}

}  // namespace dflash
