// The Qwen3 target against transformers: goldens written by tools/make_tiny_models.py.
#include <cmath>

#include "engine/generation.h"
#include "io/checkpoint.h"
#include "model/qwen3.h"
#include "test_util.h"

using namespace dflash;
using namespace dflash::test;

namespace {

struct Golden {
  std::vector<int32_t> prompt, greedy, logits_input;
  std::vector<std::vector<float>> logits, logits_f32ref;
  std::string dtype;
};

Golden load_golden(const std::string& name) {
  auto j = read_json_file(tiny(name) + "/golden.json");
  Golden g;
  g.prompt = j["prompt"].get<std::vector<int32_t>>();
  g.greedy = j["greedy"].get<std::vector<int32_t>>();
  g.logits_input = j["logits_input"].get<std::vector<int32_t>>();
  g.logits = j["logits"].get<std::vector<std::vector<float>>>();
  g.logits_f32ref = j["logits_f32ref"].get<std::vector<std::vector<float>>>();
  g.dtype = j["dtype"].get<std::string>();
  return g;
}

// ‖a − b‖₂ / ‖b‖₂ over all rows: the measure for bf16/f16 checkpoints, where transformers
// itself rounds every intermediate to 8 (or 11) mantissa bits and single logits scatter.
double relative_l2_error(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double num = 0, den = 0;
  for (size_t r = 0; r < b.size(); ++r)
    for (size_t i = 0; i < b[r].size(); ++i) {
      num += double(a[r][i] - b[r][i]) * double(a[r][i] - b[r][i]);
      den += double(b[r][i]) * double(b[r][i]);
    }
  return std::sqrt(num / den);
}

class Qwen3Golden : public ::testing::TestWithParam<std::string> {};

// Prefill the prompt (all rows), then feed the rest one token at a time through the KV
// cache: every row must match one teacher-forced transformers forward.
TEST_P(Qwen3Golden, LogitsMatchTransformers) {
  const Golden g = load_golden(GetParam());
  auto backend = make_cpu_backend();
  auto model = Qwen3Model::load(tiny(GetParam()), *backend);
  const int V = model->config().vocab_size;
  SequenceState st = model->new_sequence(64);
  std::vector<std::vector<float>> rows;
  std::vector<float> buf;
  auto take = [&](const ForwardOutput& o) {
    buf.resize(size_t(o.logits.rows) * V);
    backend->download(o.logits, buf.data());
    for (int64_t r = 0; r < o.logits.rows; ++r) rows.emplace_back(buf.begin() + r * V, buf.begin() + (r + 1) * V);
  };
  const size_t n_prompt = g.prompt.size();
  take(model->forward(st, std::vector<int32_t>(g.logits_input.begin(), g.logits_input.begin() + n_prompt), true));
  for (size_t i = n_prompt; i < g.logits_input.size(); ++i) take(model->forward(st, {g.logits_input[i]}, false));
  ASSERT_EQ(rows.size(), g.logits_f32ref.size());
  double worst_f32 = 0;
  for (size_t r = 0; r < rows.size(); ++r)
    worst_f32 = std::max(worst_f32, relative_max_error(rows[r], g.logits_f32ref[r]));
  // Our f32 compute against transformers' f32 compute on the same (possibly bf16) weights.
  EXPECT_LT(worst_f32, 1e-4) << GetParam();
  // Against transformers computing in the checkpoint's own dtype.
  if (g.dtype == "float32") {
    double worst = 0;
    for (size_t r = 0; r < rows.size(); ++r) worst = std::max(worst, relative_max_error(rows[r], g.logits[r]));
    EXPECT_LT(worst, 1e-4) << GetParam();
  } else {
    const double l2 = relative_l2_error(rows, g.logits);
    EXPECT_LT(l2, 1e-2) << GetParam();
    RecordProperty("relative_l2_vs_native", std::to_string(l2));
  }
}

TEST_P(Qwen3Golden, GreedyTokensMatchTransformers) {
  const Golden g = load_golden(GetParam());
  auto backend = make_cpu_backend();
  auto model = Qwen3Model::load(tiny(GetParam()), *backend);
  Engine engine(*model, nullptr);
  GenerationRequest req;
  req.prompt = g.prompt;
  req.max_new_tokens = static_cast<int>(g.greedy.size());
  const GenerationResult res = engine.generate_plain(req);  // eos ignored, as in the golden
  EXPECT_EQ(res.tokens, g.greedy) << GetParam();
  EXPECT_EQ(res.finish, FinishReason::Length);
}

INSTANTIATE_TEST_SUITE_P(Tiny, Qwen3Golden,
                         ::testing::Values("qwen3-gqa1-tied-f32", "qwen3-gqa4-untied-f32", "qwen3-yarn-bf16",
                                           "qwen3-linear-f16-tied", "qwen3-llama3rope-f32-sharded", "qwen3-gqa2-bf16",
                                           "qwen3-vocab16-f32"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& c : s) if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

}  // namespace
