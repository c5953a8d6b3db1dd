#pragma once
// PCRE2 (JIT, UTF + UCP) wrapper used for the pre-tokenizer split patterns. UCP makes \s, \w
// and \d Unicode-aware, which the HF (Oniguruma) patterns rely on.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dflash {

class Regex {
 public:
  // `literal` compiles the pattern as a plain string (HF's {"String": ...} split patterns).
  Regex(const std::string& pattern, bool literal, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends [start, end) byte ranges of all non-overlapping matches in `text`, which must
  // be valid UTF-8 (callers validate once up front).
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash
