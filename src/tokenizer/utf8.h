#pragma once
// UTF-8 helpers shared by the tokenizer: validation (encode rejects invalid input), lossy
// conversion with exactly Rust's String::from_utf8_lossy policy (HF decode uses it), and the
// boundary search the streaming detokenizer needs.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dflash::utf8 {

// Length of the well-formed sequence starting at data[i], or 0 if it is not one. When it is
// not, *bad_len receives the length of its longest valid prefix (at least 1) and *truncated
// whether that prefix reaches the end of the input (so more bytes could complete it).
size_t sequence_length(std::string_view data, size_t i, size_t* bad_len = nullptr,
                       bool* truncated = nullptr);

// Offset of the first invalid byte, or npos when the whole input is valid UTF-8.
size_t first_invalid(std::string_view data);

// Replaces each maximal invalid subsequence with U+FFFD, as Rust's from_utf8_lossy does.
std::string lossy(std::string_view data);
void append_lossy(std::string_view data, std::string& out);

// Length of the longest prefix that can be converted now: everything except a trailing
// sequence that is valid so far but incomplete.
size_t stable_prefix(std::string_view data);

// Decodes the code point at data[i] (which must be valid) and advances i past it.
char32_t next_code_point(std::string_view data, size_t& i);
void append_code_point(char32_t cp, std::string& out);

}  // namespace dflash::utf8
