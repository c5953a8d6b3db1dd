#include "tokenizer/byte_level.h"

#include <array>
#include <unordered_map>

#include "tokenizer/utf8.h"

namespace dflash::byte_level {
namespace {

struct Tables {
  std::array<char32_t, 256> to_char{};
  std::unordered_map<char32_t, unsigned char> to_byte;
  Tables() {
    // Printable Latin-1 bytes stand for themselves; the rest take code points from 256 up.
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_char[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<unsigned char>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_to_char(unsigned char b) { return tables().to_char[b]; }

bool decode(std::string_view token, std::string* out) {
  const auto& map = tables().to_byte;
  out->clear();
  if (utf8::first_invalid(token) != std::string_view::npos) return false;
  size_t i = 0;
  while (i < token.size()) {
    const char32_t cp = utf8::next_code_point(token, i);
    auto it = map.find(cp);
    if (it == map.end()) return false;
    out->push_back(static_cast<char>(it->second));
  }
  return true;
}

std::string token_bytes(std::string_view token) {
  std::string bytes;
  if (decode(token, &bytes)) return bytes;
  return std::string(token);
}

}  // namespace dflash::byte_level
