#pragma once
// GPT-2's byte-level alphabet: every byte is shown as a printable code point, so vocab entries
// in tokenizer.json are strings over that alphabet. We translate the vocab back to raw bytes
// once at load time and run BPE on bytes directly.
#include <string>
#include <string_view>

namespace dflash::byte_level {

// The code point that stands for byte b.
char32_t byte_to_char(unsigned char b);

// Maps a byte-level string back to raw bytes. Returns false (leaving *out unspecified) if a
// code point is outside the alphabet; HF's ByteLevel decoder then uses the token's UTF-8 as is.
bool decode(std::string_view token, std::string* out);

// HF ByteLevel decoder rule for one token: mapped bytes, or the token's own UTF-8 bytes.
std::string token_bytes(std::string_view token);

}  // namespace dflash::byte_level
