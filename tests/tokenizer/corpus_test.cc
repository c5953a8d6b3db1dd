// Ids on the whole fixture corpus must equal the HF tokenizers library's, for both families,
// with special tokens parsed and (on a subset) treated as plain text.
#include <gtest/gtest.h>

#include <utf8proc.h>

#include <cstdlib>
#include <sstream>

#include "fixtures.h"

namespace dflash {
namespace {

using testing::corpus;
using testing::fixture_path;

std::string show(const std::vector<int32_t>& ids) {
  std::ostringstream os;
  for (int32_t id : ids) os << id << ' ';
  return os.str();
}

class CorpusTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CorpusTest, IdsMatchReferenceWithSpecialTokens) {
  const Tokenizer& tok = testing::tokenizer(GetParam());
  const auto lines = testing::read_lines(fixture_path(GetParam() + ".ids"));
  const auto& texts = corpus();
  ASSERT_EQ(lines.size(), texts.size());
  ASSERT_GE(texts.size(), 20000u);
  int failures = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto expected = testing::parse_ids(lines[i]);
    const auto got = tok.encode(texts[i]);
    if (got != expected && ++failures <= 10)
      ADD_FAILURE() << "line " << i << " " << nlohmann::json(texts[i]).dump() << "\n expected "
                    << show(expected) << "\n got      " << show(got);
  }
  EXPECT_EQ(failures, 0);
}

TEST_P(CorpusTest, IdsMatchReferenceWithSpecialTokensAsText) {
  const Tokenizer& tok = testing::tokenizer(GetParam());
  const auto lines = testing::read_lines(fixture_path(GetParam() + ".nospecial.ids"));
  const auto& texts = corpus();
  ASSERT_GE(lines.size(), 4000u);
  int failures = 0;
  for (const auto& line : lines) {
    const size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos);
    const size_t i = std::stoul(line.substr(0, tab));
    ASSERT_LT(i, texts.size());
    const auto expected = testing::parse_ids(line.substr(tab + 1));
    const auto got = tok.encode(texts[i], {.parse_special = false, .add_special_tokens = false});
    if (got != expected && ++failures <= 10)
      ADD_FAILURE() << "line " << i << " " << nlohmann::json(texts[i]).dump() << "\n expected "
                    << show(expected) << "\n got      " << show(got);
  }
  EXPECT_EQ(failures, 0);
}

std::string nfc(const std::string& s) {
  utf8proc_uint8_t* out = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(s.c_str()));
  std::string r(reinterpret_cast<char*>(out));
  std::free(out);
  return r;
}

TEST_P(CorpusTest, DecodeOfEncodeIsIdentity) {
  const Tokenizer& tok = testing::tokenizer(GetParam());
  const bool normalizes = GetParam() == "qwen3";  // Qwen3 has an NFC normalizer
  for (const auto& raw : corpus()) {
    // The corpus is valid UTF-8 (lossy-decoded random bytes included), so it must survive
    // (up to the family's normalization). It has no NUL, which nfc() could not carry.
    const std::string text = normalizes ? nfc(raw) : raw;
    const auto ids = tok.encode(text, {.parse_special = true, .add_special_tokens = false});
    ASSERT_EQ(tok.decode(ids), text);
    const auto plain = tok.encode(text, {.parse_special = false, .add_special_tokens = false});
    ASSERT_EQ(tok.decode(plain), text);
  }
}

TEST_P(CorpusTest, DecodeMatchesReference) {
  const Tokenizer& tok = testing::tokenizer(GetParam());
  const auto records = testing::read_jsonl(fixture_path(GetParam() + ".decode.jsonl"));
  ASSERT_GE(records.size(), 1000u);
  for (const auto& r : records) {
    const auto ids = r["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.decode(ids), r["text"].get<std::string>()) << r["ids"].dump();
    EXPECT_EQ(tok.decode(ids, true), r["text_skip"].get<std::string>()) << r["ids"].dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CorpusTest, ::testing::Values("qwen3", "llama3.1"),
                         [](const auto& info) {
                           return info.param == "qwen3" ? std::string("Qwen3") : std::string("Llama31");
                         });

}  // namespace
}  // namespace dflash
