#include "tokenizer/utf8.h"

namespace dflash::utf8 {

size_t sequence_length(std::string_view data, size_t i, size_t* bad_len, bool* truncated) {
  const auto* s = reinterpret_cast<const unsigned char*>(data.data());
  const size_t n = data.size();
  const unsigned char b = s[i];
  if (b < 0x80) return 1;
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;  // excludes surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    if (bad_len) *bad_len = 1;
    if (truncated) *truncated = false;
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= n) {
      if (bad_len) *bad_len = k;
      if (truncated) *truncated = true;
      return 0;
    }
    const unsigned char c = s[i + k];
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) {
      if (bad_len) *bad_len = k;
      if (truncated) *truncated = false;
      return 0;
    }
  }
  return need + 1;
}

size_t first_invalid(std::string_view data) {
  size_t i = 0;
  while (i < data.size()) {
    if (static_cast<unsigned char>(data[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t len = sequence_length(data, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

void append_lossy(std::string_view data, std::string& out) {
  size_t i = 0, run = 0;  // [run, i) is valid and not yet copied
  while (i < data.size()) {
    if (static_cast<unsigned char>(data[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t bad = 0;
    const size_t len = sequence_length(data, i, &bad);
    if (len) {
      i += len;
      continue;
    }
    out.append(data.substr(run, i - run));
    out.append("\xEF\xBF\xBD");
    i += bad;
    run = i;
  }
  out.append(data.substr(run));
}

std::string lossy(std::string_view data) {
  std::string out;
  out.reserve(data.size());
  append_lossy(data, out);
  return out;
}

size_t stable_prefix(std::string_view data) {
  // Only the last (at most 3) bytes can start an incomplete sequence.
  const size_t n = data.size();
  const size_t from = n > 3 ? n - 3 : 0;
  for (size_t i = from; i < n; ++i) {
    const unsigned char b = static_cast<unsigned char>(data[i]);
    if (b < 0xC0) continue;  // ASCII or continuation byte: not a sequence start
    size_t bad = 0;
    bool truncated = false;
    if (sequence_length(data, i, &bad, &truncated) == 0 && truncated && i + bad == n) return i;
  }
  return n;
}

char32_t next_code_point(std::string_view data, size_t& i) {
  const auto* s = reinterpret_cast<const unsigned char*>(data.data());
  const unsigned char b = s[i];
  if (b < 0x80) {
    ++i;
    return b;
  }
  if (b < 0xE0) {
    char32_t cp = ((b & 0x1F) << 6) | (s[i + 1] & 0x3F);
    i += 2;
    return cp;
  }
  if (b < 0xF0) {
    char32_t cp = ((b & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    i += 3;
    return cp;
  }
  char32_t cp = ((b & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) |
                (s[i + 3] & 0x3F);
  i += 4;
  return cp;
}

void append_code_point(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace dflash::utf8
