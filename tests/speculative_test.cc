// Speculative decoding is exactly as correct as plain decoding: greedy outputs identical,
// sampled outputs identically distributed, and every edge of the loop handled.
#include <cmath>
#include <map>
#include <random>
#include <tuple>

#include "engine/acceptance.h"
#include "engine/generation.h"
#include "queued_steps.h"
#include "test_util.h"

using namespace dflash;
using namespace dflash::test;

namespace {

struct Pair {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::unique_ptr<Qwen3Model> target;
  std::unique_ptr<DFlashDrafter> drafter;
  Pair(const std::string& target_name, const std::string& drafter_name) {
    target = Qwen3Model::load(tiny(target_name), *backend);
    drafter = DFlashDrafter::load(tiny(drafter_name), *target);
  }
};

const std::vector<std::pair<std::string, std::string>> kPairs = {
    {"qwen3-gqa1-tied-f32", "dflash-qwen3-gqa1-tied-f32"},
    {"qwen3-gqa4-untied-f32", "dflash-qwen3-gqa4-untied-f32"},
    {"qwen3-yarn-bf16", "dflash-qwen3-yarn-bf16"},
    {"qwen3-vocab16-f32", "dflash-qwen3-vocab16-f32"},
};

std::vector<int32_t> random_prompt(std::mt19937& rng, int vocab) {
  const int len = 1 + static_cast<int>(rng() % 24);
  std::vector<int32_t> p(len);
  for (auto& t : p) t = static_cast<int32_t>(rng() % (vocab - 1));
  return p;
}

// 50 prompts × every tiny pair × blocks 2, 4 and 16: identical tokens and finish reasons.
TEST(SpeculativeExactness, GreedyEqualsPlainOnEveryPairAndBlockSize) {
  for (const auto& [t, d] : kPairs) {
    Pair pair(t, d);
    const int vocab = pair.target->config().vocab_size;
    for (int block : {2, 4, 16}) {
      EngineOptions opts;
      opts.block_size = block;
      opts.adaptive = false;  // every step drafts: the hardest test of the loop
      Engine engine(*pair.target, pair.drafter.get(), opts);
      std::mt19937 rng(1234 + block);
      int64_t multi_token_steps = 0;
      for (int i = 0; i < 50; ++i) {
        GenerationRequest req;
        req.prompt = random_prompt(rng, vocab);
        req.max_new_tokens = 24 + i % 9;
        const auto plain = engine.generate_plain(req);
        const auto spec = engine.generate_speculative(req);
        ASSERT_EQ(spec.tokens, plain.tokens) << t << " block " << block << " prompt " << i;
        ASSERT_EQ(spec.finish, plain.finish);
        for (int L : spec.stats.step_acceptance) multi_token_steps += L > 1;
      }
      // The comparison means little unless drafts were really accepted and rolled back.
      EXPECT_GT(multi_token_steps, 0) << t << " block " << block;
    }
  }
}

TEST(SpeculativeExactness, GreedyWithRepetitionPenaltyEqualsPlain) {
  Pair pair("qwen3-gqa4-untied-f32", "dflash-qwen3-gqa4-untied-f32");
  EngineOptions opts;
  opts.adaptive = false;
  Engine engine(*pair.target, pair.drafter.get(), opts);
  GenerationRequest req;
  req.prompt = {5, 9, 200, 17};
  req.max_new_tokens = 40;
  req.sampling.repetition_penalty = 1.3;
  req.sampling.presence_penalty = 0.5;
  EXPECT_EQ(engine.generate_speculative(req).tokens, engine.generate_plain(req).tokens);
}

// Upper tail of the chi-square distribution (Wilson–Hilferty; accurate to ~1e-3 relative
// for the tens to hundreds of degrees of freedom used here).
double chi_square_p_value(double x, double df) {
  const double z = (std::cbrt(x / df) - (1 - 2 / (9 * df))) / std::sqrt(2 / (9 * df));
  return 0.5 * std::erfc(z / std::sqrt(2.0));
}

// Two-sample chi-square test of homogeneity over the first three generated tokens; cells
// with fewer than 10 pooled observations are merged into one.
double homogeneity_p_value(const std::map<std::vector<int32_t>, int>& a, const std::map<std::vector<int32_t>, int>& b,
                           int na, int nb) {
  std::map<std::vector<int32_t>, std::pair<int, int>> cells;
  for (const auto& [k, v] : a) cells[k].first += v;
  for (const auto& [k, v] : b) cells[k].second += v;
  std::vector<std::pair<int, int>> merged;
  std::pair<int, int> rare{0, 0};
  for (const auto& [k, v] : cells) {
    if (v.first + v.second < 10) {
      rare.first += v.first;
      rare.second += v.second;
    } else {
      merged.push_back(v);
    }
  }
  if (rare.first + rare.second > 0) merged.push_back(rare);
  double chi = 0;
  const double n = na + nb;
  for (const auto& [ca, cb] : merged) {
    const double tot = ca + cb, ea = tot * na / n, eb = tot * nb / n;
    chi += (ca - ea) * (ca - ea) / ea + (cb - eb) * (cb - eb) / eb;
  }
  return chi_square_p_value(chi, double(merged.size() - 1));
}

struct SamplingRun {
  std::map<std::vector<int32_t>, int> plain, spec;
  int n = 0;
};

SamplingRun sample_first_three(Pair& pair, const SamplingParams& base, int samples, const AcceptanceRule* rule) {
  EngineOptions opts;
  opts.adaptive = false;
  opts.acceptance = rule;
  Engine engine(*pair.target, pair.drafter.get(), opts);
  SamplingRun run;
  run.n = samples;
  GenerationRequest req;
  req.prompt = {3, 7, 1};
  req.max_new_tokens = 3;
  req.sampling = base;
  for (int i = 0; i < samples; ++i) {
    req.sampling.seed = 1000003ULL * i + 1;
    run.plain[engine.generate_plain(req).tokens]++;
    req.sampling.seed = 7000001ULL * i + 2;
    run.spec[engine.generate_speculative(req).tokens]++;
  }
  return run;
}

TEST(SpeculativeSampling, DistributionEqualsPlainSampling) {
  Pair pair("qwen3-vocab16-f32", "dflash-qwen3-vocab16-f32");
  for (const auto& [temperature, top_k, top_p] : std::vector<std::tuple<double, int, double>>{{1.0, 0, 1.0}, {0.8, 6, 0.9}}) {
    SamplingParams sp;
    sp.temperature = temperature;
    sp.top_k = top_k;
    sp.top_p = top_p;
    const auto run = sample_first_three(pair, sp, 10000, nullptr);
    const double p = homogeneity_p_value(run.plain, run.spec, run.n, run.n);
    EXPECT_GT(p, 0.001) << "temperature " << temperature << " top_k " << top_k << " top_p " << top_p;
  }
}

// Temperature alone with the rows left where they are (LogitRows' DeviceRows form, which the
// GPU uses; forced here on the CPU backend, whose defaults implement it on the host): draws,
// p(d), q(d) and the replacement from max(0, p − q) through Backend::draw_from_rows (a block's
// drafts and their laws in one call), row_laws (a verification's laws and p(d) in one) and
// draw_from_excess.
TEST(SpeculativeSampling, DistributionEqualsPlainSamplingWithRowsLeftInPlace) {
  Pair pair("qwen3-vocab16-f32", "dflash-qwen3-vocab16-f32");
  setenv("DFLASH_LOGIT_ROWS", "device", 1);
  SamplingParams sp;
  sp.temperature = 1.0;
  const auto run = sample_first_three(pair, sp, 10000, nullptr);
  unsetenv("DFLASH_LOGIT_ROWS");
  EXPECT_GT(homogeneity_p_value(run.plain, run.spec, run.n, run.n), 0.001);
}

// Top-p, and min-p alone, with every row's law left where it is (Backend::top_p_laws, the GPU's
// form for a nucleus over the candidate cap and for min-p alone; forced here on the CPU
// backend): the law's cut goes with every draw, p(d) and q(d), and the replacement from
// max(0, p − q).
TEST(SpeculativeSampling, DistributionEqualsPlainSamplingWithTopPLawsLeftInPlace) {
  Pair pair("qwen3-vocab16-f32", "dflash-qwen3-vocab16-f32");
  setenv("DFLASH_LOGIT_ROWS", "device", 1);
  for (const auto& [top_p, min_p] : std::vector<std::pair<double, double>>{{0.8, 0.0}, {1.0, 0.1}}) {
    SamplingParams sp;
    sp.temperature = 1.0;
    sp.top_p = top_p;
    sp.min_p = min_p;
    const auto run = sample_first_three(pair, sp, 10000, nullptr);
    EXPECT_GT(homogeneity_p_value(run.plain, run.spec, run.n, run.n), 0.001) << "top_p " << top_p << " min_p " << min_p;
  }
  unsetenv("DFLASH_LOGIT_ROWS");
}

// With penalties every row is penalised where it is (Backend::apply_penalties): a
// verification's rows for the drafts before them, the draft's for the committed tokens only, so
// q is not the target's kind of law; the acceptance rule makes the output p's all the same.
// Strong penalties on the vocabulary-16 pair make plain sampling almost never repeat a token,
// so a verification row that missed the drafts before it would show up as repeats.
TEST(SpeculativeSampling, DistributionEqualsPlainSamplingWithPenalties) {
  Pair pair("qwen3-vocab16-f32", "dflash-qwen3-vocab16-f32");
  for (const char* env : {"", "device"})
    for (const auto& [top_p, repetition, presence] :
         std::vector<std::tuple<double, double, double>>{{1.0, 2.0, 3.0}, {0.9, 1.0, 4.0}}) {
      setenv("DFLASH_LOGIT_ROWS", env, 1);
      SamplingParams sp;
      sp.temperature = 1.0;
      sp.top_p = top_p;
      sp.repetition_penalty = repetition;
      sp.presence_penalty = presence;
      const auto run = sample_first_three(pair, sp, 10000, nullptr);
      unsetenv("DFLASH_LOGIT_ROWS");
      EXPECT_GT(homogeneity_p_value(run.plain, run.spec, run.n, run.n), 0.001)
          << "DFLASH_LOGIT_ROWS=" << env << " top_p " << top_p << " repetition " << repetition << " presence " << presence;
    }
}

// A classic bug: after a rejection, draw the replacement from p instead of max(0, p − q).
class ResampleFromTargetRule final : public AcceptanceRule {
 public:
  int32_t replacement(const TokenLaw& p, const TokenLaw&, Rng& rng) const override {
    return p.draw(rng);
  }
};

TEST(SpeculativeSampling, TheTestRejectsABrokenAcceptanceRule) {
  Pair pair("qwen3-vocab16-f32", "dflash-qwen3-vocab16-f32");
  SamplingParams sp;
  sp.temperature = 1.0;
  ResampleFromTargetRule broken;
  const auto run = sample_first_three(pair, sp, 10000, &broken);
  EXPECT_LT(homogeneity_p_value(run.plain, run.spec, run.n, run.n), 0.001);
}

// --- Edge cases -------------------------------------------------------------------------

struct EdgeFixture : ::testing::Test {
  Pair pair{"qwen3-gqa4-untied-f32", "dflash-qwen3-gqa4-untied-f32"};
  EngineOptions opts = [] {
    EngineOptions o;
    o.adaptive = false;
    return o;
  }();
};

TEST_F(EdgeFixture, MaxNewTokensSmallerThanTheBlock) {
  Engine engine(*pair.target, pair.drafter.get(), opts);
  for (int n : {1, 2, 3, 5}) {
    GenerationRequest req;
    req.prompt = {80, 128, 158, 187, 70, 173, 121, 13, 235, 147};
    req.max_new_tokens = n;
    const auto spec = engine.generate_speculative(req);
    EXPECT_EQ(spec.tokens.size(), size_t(n));
    EXPECT_EQ(spec.tokens, engine.generate_plain(req).tokens);
    EXPECT_EQ(spec.finish, FinishReason::Length);
  }
}

TEST_F(EdgeFixture, EndOfSequenceInsideAnAcceptedRun) {
  Engine engine(*pair.target, pair.drafter.get(), opts);
  GenerationRequest req;
  req.prompt = {80, 128, 158, 187, 70, 173, 121, 13, 235, 147};
  req.max_new_tokens = 40;
  const auto free_run = engine.generate_speculative(req);
  // Find a token committed as an accepted draft (not an anchor) at its first occurrence.
  int32_t eos = -1;
  size_t where = 0, pos = 1;  // output[0] is the prefill anchor
  for (int L : free_run.stats.step_acceptance) {
    for (int i = 0; i + 1 < L && eos < 0; ++i) {
      const size_t k = pos + i;
      if (std::find(free_run.tokens.begin(), free_run.tokens.begin() + k, free_run.tokens[k]) == free_run.tokens.begin() + k &&
          i + 2 < L) {  // more accepted drafts follow it in the same step
        eos = free_run.tokens[k];
        where = k;
      }
    }
    pos += L;
  }
  ASSERT_GE(eos, 0) << "no multi-token step in the free run";
  req.eos_ids = {eos};
  const auto spec = engine.generate_speculative(req);
  EXPECT_EQ(spec.tokens.size(), where + 1);
  EXPECT_EQ(spec.tokens.back(), eos);
  EXPECT_EQ(spec.finish, FinishReason::Stop);
  EXPECT_EQ(spec.tokens, engine.generate_plain(req).tokens);
}

TEST_F(EdgeFixture, OneTokenPrompt) {
  Engine engine(*pair.target, pair.drafter.get(), opts);
  for (int32_t t : {0, 5, 77, 254}) {
    GenerationRequest req;
    req.prompt = {t};
    req.max_new_tokens = 30;
    EXPECT_EQ(engine.generate_speculative(req).tokens, engine.generate_plain(req).tokens);
  }
}

TEST_F(EdgeFixture, ContextLimitReachedInTheMiddleOfABlock) {
  opts.context_length = 20;
  Engine engine(*pair.target, pair.drafter.get(), opts);
  GenerationRequest req;
  req.prompt = {80, 128, 158, 187, 70, 173, 121, 13, 235, 147, 1, 2, 3};  // 13 of 20 positions
  req.max_new_tokens = 100;
  const auto plain = engine.generate_plain(req);
  const auto spec = engine.generate_speculative(req);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_EQ(spec.finish, FinishReason::Length);
  EXPECT_EQ(plain.tokens.size(), size_t(20 - 13 + 1));  // the last token needs no position
}

TEST_F(EdgeFixture, PromptLongerThanTheContextIsAClearError) {
  opts.context_length = 8;
  Engine engine(*pair.target, pair.drafter.get(), opts);
  GenerationRequest req;
  req.prompt = std::vector<int32_t>(9, 3);
  const auto msg = error_of([&] { engine.generate_speculative(req); });
  EXPECT_NE(msg.find("the prompt has 9 tokens, longer than the context of 8"), std::string::npos) << msg;
}

TEST_F(EdgeFixture, StatisticsAreConsistent) {
  Engine engine(*pair.target, pair.drafter.get(), opts);
  GenerationRequest req;
  req.prompt = {80, 128, 158, 187, 70, 173, 121, 13, 235, 147};
  req.max_new_tokens = 40;
  const auto res = engine.generate_speculative(req);
  const auto& st = res.stats;
  int64_t steps = 0, committed = 0;
  for (size_t L = 0; L < st.acceptance_histogram.size(); ++L) {
    steps += st.acceptance_histogram[L];
    committed += st.acceptance_histogram[L] * int64_t(L + 1);
  }
  EXPECT_EQ(steps, st.steps);
  EXPECT_EQ(st.generated_tokens, int64_t(res.tokens.size()));
  EXPECT_EQ(st.first_tokens, 1);  // the prefill's anchor: not decoding's
  // The prefill anchor plus every step's commits, cut to max_new_tokens.
  EXPECT_GE(committed + 1, int64_t(res.tokens.size()));
  EXPECT_LT(committed + 1 - int64_t(res.tokens.size()), 16);
  const auto rates = st.per_position_acceptance();
  ASSERT_EQ(rates.size(), 15u);
  EXPECT_EQ(st.row_reached[1], st.steps);  // row 1 is tried every step
  for (double r : rates) EXPECT_TRUE(r >= 0.0 && r <= 1.0);
}

}  // namespace

namespace {
// The benchmark-only forced mode commits exactly k tokens a step (and says nothing about
// exactness, which is why it is off unless asked for).
TEST(ForcedAcceptance, CommitsExactlyKTokensPerStep) {
  Pair pair("qwen3-gqa4-untied-f32", "dflash-qwen3-gqa4-untied-f32");
  for (int k : {3, 5, 7}) {
    EngineOptions opts;
    opts.adaptive = false;
    opts.forced_acceptance = k;
    Engine engine(*pair.target, pair.drafter.get(), opts);
    GenerationRequest req;
    req.prompt = {1, 2, 3};
    req.max_new_tokens = 1 + 4 * k;
    const auto res = engine.generate_speculative(req);
    EXPECT_EQ(res.stats.mean_acceptance_length(), double(k));
    EXPECT_EQ(res.stats.steps, 4);
  }
}
}  // namespace

namespace {
TEST(QueuedSteps, EqualHostDrivenSteps) {
  for (const auto& [t, d] : {kPairs[1], kPairs[3]}) {
    Pair pair(t, d);
    expect_queued_equals_host_driven(*pair.target, *pair.drafter, 12, 7);
  }
}

TEST(QueuedSteps, TruncatedContextEqualsCommittedRows) {
  for (const auto& [t, d] : kPairs) {
    Pair pair(t, d);
    expect_truncated_context_equals_committed_rows(*pair.target, *pair.drafter);
  }
}
}  // namespace
