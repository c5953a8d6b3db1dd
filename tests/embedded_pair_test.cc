// The pair that ships under models/ (a Qwen3-architecture Python-code model and its DFlash
// drafter, trained by tools/train/): speculation stays exact on it and keeps its acceptance.
#include <fstream>

#include "engine/generation.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace dflash;
using namespace dflash::test;

namespace {

// Measured when the pair landed: 3.058 on the first 8 held-out prompts × 64 tokens (greedy, block
// 16, f32 compute; the whole set at 128 tokens gives 3.65 here and 3.66 in the reference loop).
// The floor leaves room for other CPUs' rounding to flip a few near-tie drafts.
constexpr double kAcceptanceFloor = 2.8;

struct HeldoutPrompt {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<HeldoutPrompt> heldout(size_t n) {
  std::ifstream in(source_path("models/prompts/heldout.jsonl"));
  std::vector<HeldoutPrompt> out;
  std::string line;
  while (out.size() < n && std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    out.push_back({j["prompt"].get<std::string>(), j["prompt_ids"].get<std::vector<int32_t>>()});
  }
  return out;
}

class EmbeddedPair : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = make_cpu_backend().release();
    target_ = Qwen3Model::load(source_path("models/qwen3-pycode-15m"), *backend_).release();
    drafter_ = DFlashDrafter::load(source_path("models/qwen3-pycode-15m-dflash"), *target_).release();
  }
  static void TearDownTestSuite() {
    delete drafter_;
    delete target_;
    delete backend_;
  }
  static Backend* backend_;
  static Qwen3Model* target_;
  static DFlashDrafter* drafter_;
};
Backend* EmbeddedPair::backend_ = nullptr;
Qwen3Model* EmbeddedPair::target_ = nullptr;
DFlashDrafter* EmbeddedPair::drafter_ = nullptr;

TEST_F(EmbeddedPair, TokenizerReproducesTheTrainingScriptsIds) {
  const Tokenizer tok = Tokenizer::from_dir(source_path("models/qwen3-pycode-15m"));
  for (const auto& p : heldout(32)) EXPECT_EQ(tok.encode(p.text), p.ids);
}

// Greedy, block 16, every step drafting: identical tokens to plain decoding, and a mean
// acceptance length above the floor.
TEST_F(EmbeddedPair, SpeculativeEqualsPlainAndKeepsItsAcceptance) {
  EngineOptions opts;
  opts.adaptive = false;
  Engine engine(*target_, drafter_, opts);
  GenerationStats all;
  for (const auto& p : heldout(8)) {
    GenerationRequest req;
    req.prompt = p.ids;
    req.max_new_tokens = 64;
    req.eos_ids = {4093};
    const auto plain = engine.generate_plain(req);
    const auto spec = engine.generate_speculative(req);
    EXPECT_EQ(spec.tokens, plain.tokens);
    all.merge(spec.stats);
  }
  std::printf("mean acceptance length on 8 held-out prompts: %.3f\n", all.mean_acceptance_length());
  EXPECT_GT(all.mean_acceptance_length(), kAcceptanceFloor);
}

// Greedy with penalties on a real pair: the output is still plain decoding's, with the drafts
// accepted often enough for that to mean something, and the penalties changing the outputs.
// (A long prompt already holds most tokens a block drafts, so a verification row that missed
// the drafts before it rarely changes a greedy choice here: the vocabulary-16 sampling test,
// SpeculativeSampling.DistributionEqualsPlainSamplingWithPenalties, is the one that fails then.)
TEST_F(EmbeddedPair, SpeculativeWithPenaltiesEqualsPlain) {
  EngineOptions opts;
  opts.adaptive = false;
  Engine engine(*target_, drafter_, opts);
  GenerationStats all;
  int changed = 0;
  for (const auto& p : heldout(4)) {
    GenerationRequest req;
    req.prompt = p.ids;
    req.max_new_tokens = 48;
    req.eos_ids = {4093};
    const auto unpenalised = engine.generate_plain(req);
    req.sampling.repetition_penalty = 1.05;
    req.sampling.presence_penalty = 0.2;
    const auto plain = engine.generate_plain(req);
    const auto spec = engine.generate_speculative(req);
    EXPECT_EQ(spec.tokens, plain.tokens);
    changed += plain.tokens != unpenalised.tokens;
    all.merge(spec.stats);
  }
  EXPECT_GE(changed, 3) << "the penalties should change most outputs";
  std::printf("mean acceptance length with penalties: %.3f\n", all.mean_acceptance_length());
  EXPECT_GT(all.mean_acceptance_length(), 2.0);  // 2.56 on the first 8 prompts at 64 tokens
}

}  // namespace
