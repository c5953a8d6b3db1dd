// Streaming detokenization and UTF-8 edge cases.
#include <gtest/gtest.h>

#include <random>

#include "fixtures.h"
#include "tokenizer/utf8.h"

namespace dflash {
namespace {

bool valid_utf8(const std::string& s) { return utf8::first_invalid(s) == std::string_view::npos; }

class IncrementalTest : public ::testing::TestWithParam<std::string> {};

TEST_P(IncrementalTest, EqualsFullDecodeOnCorpusAndNeverEmitsInvalidUtf8) {
  const Tokenizer& tok = testing::tokenizer(GetParam());
  const auto& texts = testing::corpus();
  for (size_t i = 0; i < texts.size(); i += 3) {
    const auto ids = tok.encode(texts[i]);
    for (bool skip : {false, true}) {
      IncrementalDecoder dec(tok, skip);
      std::string streamed;
      for (int32_t id : ids) {
        const std::string piece = dec.push(id);
        ASSERT_TRUE(valid_utf8(piece)) << "line " << i;
        streamed += piece;
      }
      const std::string tail = dec.flush();
      ASSERT_TRUE(valid_utf8(tail));
      streamed += tail;
      ASSERT_EQ(streamed, tok.decode(ids, skip)) << "line " << i;
    }
  }
}

TEST_P(IncrementalTest, RandomIdsIncludingBrokenSequences) {
  const Tokenizer& tok = testing::tokenizer(GetParam());
  std::mt19937 rng(7);
  // Byte tokens for lead and continuation bytes make incomplete and invalid UTF-8 common.
  std::vector<int32_t> pool;
  for (int b = 0x80; b < 0x100; ++b)
    for (int32_t id = 0; id < 2000; ++id)
      if (tok.token_bytes(id) == std::string(1, static_cast<char>(b))) pool.push_back(id);
  ASSERT_GT(pool.size(), 100u);
  std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(tok.vocab_size()) + 10);
  for (int round = 0; round < 3000; ++round) {
    std::vector<int32_t> ids;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < n; ++k) ids.push_back(rng() % 3 ? pool[rng() % pool.size()] : any(rng));
    IncrementalDecoder dec(tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = dec.push(id);
      ASSERT_TRUE(valid_utf8(piece));
      streamed += piece;
    }
    streamed += dec.flush();
    ASSERT_EQ(streamed, tok.decode(ids));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, IncrementalTest, ::testing::Values("qwen3", "llama3.1"),
                         [](const auto& info) {
                           return info.param == "qwen3" ? std::string("Qwen3") : std::string("Llama31");
                         });

TEST(Incremental, HoldsBackSplitCharacter) {
  const Tokenizer& tok = testing::tokenizer("llama3.1");
  // "é" is C3 A9: feed its two byte tokens separately.
  const int32_t c3 = *tok.token_to_id("Ã"), a9 = *tok.token_to_id("©");
  IncrementalDecoder dec(tok);
  EXPECT_EQ(dec.push(c3), "");
  EXPECT_EQ(dec.push(a9), "\xC3\xA9");
  EXPECT_EQ(dec.push(c3), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");  // a dangling lead byte becomes U+FFFD at the end
  EXPECT_EQ(dec.flush(), "");
}

TEST(Utf8, LossyMatchesRustPolicy) {
  // One U+FFFD per maximal invalid subpart (Unicode's recommended practice, as in Rust).
  EXPECT_EQ(utf8::lossy("a\xF0\x90\x80z"), "a\xEF\xBF\xBDz");
  EXPECT_EQ(utf8::lossy("\xE0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8::lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8::lossy("\xC3\xA9\xFF"), "\xC3\xA9\xEF\xBF\xBD");
  EXPECT_EQ(utf8::stable_prefix("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(utf8::stable_prefix("ab\xF0\x9F\x98\x80"), 6u);
  EXPECT_EQ(utf8::stable_prefix("ab\xE0\x80"), 4u);  // invalid already: nothing to wait for
}

TEST(Decode, SkipSpecialTokensAndUnknownIds) {
  const Tokenizer& tok = testing::tokenizer("qwen3");
  const auto ids = tok.encode("<|im_start|>user\nhi<think>x</think><|im_end|>");
  EXPECT_EQ(tok.decode(ids, true), "user\nhi<think>x</think>");  // <think> is not special
  std::vector<int32_t> with_unknown = ids;
  with_unknown.push_back(-1);
  with_unknown.push_back(1 << 30);
  EXPECT_EQ(tok.decode(with_unknown), tok.decode(ids));
}

}  // namespace
}  // namespace dflash
