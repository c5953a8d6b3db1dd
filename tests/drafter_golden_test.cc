// The DFlash drafter against the PyTorch reference written from the contract
// (tools/dflash_torch.py; goldens from tools/make_tiny_drafters.py).
#include <cmath>

#include "engine/generation.h"
#include "io/checkpoint.h"
#include "model/dflash_drafter.h"
#include "test_util.h"

using namespace dflash;
using namespace dflash::test;

namespace {

std::vector<float> flatten(const nlohmann::json& rows) {
  std::vector<float> out;
  for (const auto& r : rows) for (const auto& v : r) out.push_back(v.get<float>());
  return out;
}

std::vector<float> download(Backend& b, const Tensor& t) {
  std::vector<float> v(size_t(t.rows * t.cols));
  b.download(t, v.data());
  return v;
}

struct Pair {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::unique_ptr<Qwen3Model> target;
  std::unique_ptr<DFlashDrafter> drafter;
  nlohmann::json golden;
  explicit Pair(const std::string& drafter_name) {
    golden = read_json_file(tiny(drafter_name) + "/drafter_golden.json");
    target = Qwen3Model::load(tiny(golden["target"].get<std::string>()), *backend);
    drafter = DFlashDrafter::load(tiny(drafter_name), *target);
  }
};

class DrafterGolden : public ::testing::TestWithParam<std::string> {};

// Two drafting steps: the first over the prompt's features, the second after four more
// committed rows were appended to the drafter's cache.
TEST_P(DrafterGolden, BlockLogitsMatchReference) {
  Pair p(GetParam());
  const auto& g = p.golden;
  const int B = g["block_size"].get<int>();
  const double tol = g["compute_dtype"] == "float32" ? 1e-4 : 1e-2;
  SequenceState ts = p.target->new_sequence(64), ds = p.drafter->new_sequence(64 + B);
  const auto& ids = p.drafter->config().target_layer_ids;

  ForwardOutput pre = p.target->forward(ts, g["prompt"].get<std::vector<int32_t>>(), false, ids);
  const auto feats = download(*p.backend, pre.features);
  const auto row0 = g["features_row0"].get<std::vector<float>>();
  EXPECT_LT(relative_max_error(std::vector<float>(feats.begin(), feats.begin() + row0.size()), row0), 1e-4)
      << "context features of row 0 differ: layer offset?";
  p.drafter->add_context(ds, pre.features);
  ASSERT_EQ(ds.length(), g["step1_context_len"].get<int64_t>());
  auto l1 = download(*p.backend, p.drafter->draft(ds, g["step1_anchor"].get<int32_t>(), B));
  EXPECT_LT(relative_max_error(l1, flatten(g["step1_logits"])), tol);
  EXPECT_EQ(p.backend->argmax_rows(p.drafter->draft(ds, g["step1_anchor"].get<int32_t>(), B)),
            g["step1_draft"].get<std::vector<int32_t>>());

  ForwardOutput more = p.target->forward(ts, g["step2_new_context_tokens"].get<std::vector<int32_t>>(), false, ids);
  p.drafter->add_context(ds, more.features);
  ASSERT_EQ(ds.length(), g["step2_context_len"].get<int64_t>());
  auto l2 = download(*p.backend, p.drafter->draft(ds, g["step2_anchor"].get<int32_t>(), B));
  EXPECT_LT(relative_max_error(l2, flatten(g["step2_logits"])), tol);
}

// The whole greedy loop against the reference loop: same tokens, same acceptance lengths.
TEST_P(DrafterGolden, GreedyLoopMatchesReferenceLoop) {
  Pair p(GetParam());
  const auto& ref = p.golden["reference_generate"];
  EngineOptions opts;
  opts.block_size = ref["block_size"].get<int>();
  opts.adaptive = false;
  Engine engine(*p.target, p.drafter.get(), opts);
  GenerationRequest req;
  req.prompt = p.golden["prompt"].get<std::vector<int32_t>>();
  req.max_new_tokens = ref["max_new_tokens"].get<int>();
  const auto res = engine.generate_speculative(req);
  EXPECT_EQ(res.tokens, ref["tokens"].get<std::vector<int32_t>>());
  // The reference counts the anchor as output only when a step commits it, so it may run one
  // more (useless) step once the budget is met; every step both ran must agree.
  const auto want = ref["acceptance_lengths"].get<std::vector<int>>();
  const auto& got = res.stats.step_acceptance;
  ASSERT_GE(got.size() + 1, want.size());
  ASSERT_LE(got.size(), want.size());
  EXPECT_EQ(got, std::vector<int>(want.begin(), want.begin() + got.size()));
}

INSTANTIATE_TEST_SUITE_P(Tiny, DrafterGolden,
                         ::testing::Values("dflash-qwen3-gqa1-tied-f32", "dflash-qwen3-gqa4-untied-f32",
                                           "dflash-qwen3-yarn-bf16", "dflash-qwen3-vocab16-f32"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& c : s) if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

}  // namespace
