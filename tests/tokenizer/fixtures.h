#pragma once
// Loads the committed fixtures written by tools/make_tokenizer_fixtures.py, and caches one
// Tokenizer per family for the whole test binary (loading takes a few hundred ms).
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace dflash::testing {

inline std::string fixture_path(const std::string& name) {
  return std::string(DFLASH_SOURCE_DIR) + "/testdata/tokenizers/fixtures/" + name;
}

inline std::string model_dir(const std::string& family) {
  return std::string(DFLASH_TOKENIZER_DATA) + "/" + family;  // unpacked by CMake
}

inline const Tokenizer& tokenizer(const std::string& family) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[family];
  if (!slot) slot = std::make_unique<Tokenizer>(Tokenizer::from_dir(model_dir(family)));
  return *slot;
}

inline std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// Three base-64 digits per id (see ids_line in the script).
inline std::vector<int32_t> parse_ids(const std::string& s) {
  auto digit = [](char c) -> int32_t {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    throw std::runtime_error("bad id digit");
  };
  if (s.size() % 3) throw std::runtime_error("bad ids line length");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < s.size(); i += 3)
    ids.push_back(digit(s[i]) << 12 | digit(s[i + 1]) << 6 | digit(s[i + 2]));
  return ids;
}

inline const std::vector<std::string>& corpus() {
  static const std::vector<std::string> c = [] {
    std::vector<std::string> out;
    for (const auto& line : read_lines(fixture_path("corpus.jsonl")))
      out.push_back(nlohmann::json::parse(line).get<std::string>());
    return out;
  }();
  return c;
}

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  for (const auto& line : read_lines(path)) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace dflash::testing
