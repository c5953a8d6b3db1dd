// The sampling warpers (temperature, top-k, top-p, min-p) against transformers' own warpers on
// the same logits (testdata/sampling/warpers_golden.json, made by tools/make_sampling_golden.py):
// the same tokens survive, with the same probabilities to f32 rounding. The cases cover top-p
// over the whole 32 000-token row and after top-k, and min-p.
#include <cmath>
#include <cstdint>

#include "engine/sampling.h"
#include "io/checkpoint.h"
#include "test_util.h"

using namespace dflash;
using namespace dflash::test;

namespace {

// The golden's logits (see the script): exact in double, then rounded to f32.
std::vector<float> golden_logits(int row, int vocab) {
  std::vector<float> l(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i) {
    const uint64_t h = (uint64_t(i + 1) * 2654435761ULL + uint64_t(row) * 40503ULL) % (1ULL << 32);
    double u = double(h) / double(1ULL << 32);
    for (int s = 0; s < 6; ++s) u = u * u;
    l[size_t(i)] = static_cast<float>(30.0 * u - 5.0);
  }
  return l;
}

TEST(SamplingWarpers, SameTokensAndProbabilitiesAsTransformers) {
  const auto g = read_json_file(source_path("testdata/sampling/warpers_golden.json"));
  const int vocab = g["vocab"].get<int>();
  ASSERT_GT(g["cases"].size(), 0u);
  for (const auto& c : g["cases"]) {
    SamplingParams sp;
    sp.temperature = c["temperature"].get<double>();
    sp.top_k = c["top_k"].get<int>();
    sp.top_p = c["top_p"].get<double>();
    sp.min_p = c["min_p"].get<double>();
    const int row = c["row"].get<int>();
    SCOPED_TRACE("row " + std::to_string(row) + " T " + std::to_string(sp.temperature) + " top_k " +
                 std::to_string(sp.top_k) + " top_p " + std::to_string(sp.top_p) + " min_p " +
                 std::to_string(sp.min_p));
    const auto logits = golden_logits(row, vocab);
    const auto probs = token_distribution(logits.data(), vocab, sp, TokenHistory{});
    std::vector<int32_t> kept;
    for (int i = 0; i < vocab; ++i) if (probs[size_t(i)] > 0) kept.push_back(i);
    const auto want = c["kept"].get<std::vector<int32_t>>();
    const auto want_p = c["probs"].get<std::vector<double>>();
    ASSERT_EQ(kept, want);
    for (size_t j = 0; j < want.size(); ++j)
      EXPECT_NEAR(probs[size_t(want[j])], want_p[j], 1e-6 + 2e-5 * want_p[j]) << "token " << want[j];
  }
}

// Ties at the top-k threshold are all kept (transformers keeps every logit ≥ the k-th largest).
TEST(SamplingWarpers, TopKKeepsTiesAtTheThreshold) {
  std::vector<float> l = {1.f, 3.f, 2.f, 3.f, 2.f, 0.f};
  SamplingParams sp;
  sp.temperature = 1.0;
  sp.top_k = 3;
  const auto p = token_distribution(l.data(), int(l.size()), sp, TokenHistory{});
  EXPECT_EQ(p[0], 0.f);
  EXPECT_GT(p[1], 0.f);
  EXPECT_GT(p[2], 0.f);
  EXPECT_GT(p[4], 0.f);
  EXPECT_EQ(p[5], 0.f);
  EXPECT_FLOAT_EQ(p[2], p[4]);
}

}  // namespace
