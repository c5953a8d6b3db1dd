// Stop strings match decoded text, across token boundaries, and cut the text before them.
#include "engine/generation.h"
#include "engine/stop_strings.h"
#include "test_util.h"

using namespace dflash;
using namespace dflash::test;

namespace {

const Tokenizer& tokenizer() {
  static const Tokenizer t = Tokenizer::from_dir(source_path("models/qwen3-pycode-15m"));
  return t;
}

TEST(StopStrings, MatchAcrossTokensAndCutTheText) {
  const auto ids = tokenizer().encode("def f(x):\n    return x\n\nclass A:\n    pass\n");
  StopStringMatcher m(tokenizer(), {"\nclass", "never"});
  std::vector<int32_t> out;
  bool stopped = false;
  size_t stop_at = 0;
  for (size_t i = 0; i < ids.size() && !stopped; ++i) {
    out.push_back(ids[i]);
    stopped = m.update(out);
    stop_at = i;
  }
  ASSERT_TRUE(stopped);
  EXPECT_EQ(m.text(), "def f(x):\n    return x\n");
  // It fired on the token that completed "\nclass", not later.
  EXPECT_NE(tokenizer().decode(std::vector<int32_t>(ids.begin(), ids.begin() + stop_at + 1)).find("\nclass"),
            std::string::npos);
  EXPECT_EQ(tokenizer().decode(std::vector<int32_t>(ids.begin(), ids.begin() + stop_at)).find("\nclass"),
            std::string::npos);
}

TEST(StopStrings, EndTheSpeculativeAndThePlainLoopAlike) {
  auto backend = make_cpu_backend();
  auto target = Qwen3Model::load(source_path("models/qwen3-pycode-15m"), *backend);
  auto drafter = DFlashDrafter::load(source_path("models/qwen3-pycode-15m-dflash"), *target);
  EngineOptions opts;
  opts.adaptive = false;
  Engine engine(*target, drafter.get(), opts);
  GenerationRequest req;
  req.prompt = tokenizer().encode("import os\n\n\ndef main():\n");
  req.max_new_tokens = 80;
  const auto free_run = engine.generate_plain(req);
  const std::string text = tokenizer().decode(free_run.tokens);
  ASSERT_GT(text.size(), 20u);
  const std::string stop = text.substr(text.size() / 2, 4);  // a piece of the middle of the output
  std::vector<std::string> results;
  for (bool speculative : {false, true}) {
    auto matcher = std::make_shared<StopStringMatcher>(tokenizer(), std::vector<std::string>{stop});
    req.stop_check = [matcher](const std::vector<int32_t>& o) { return matcher->update(o); };
    const auto res = speculative ? engine.generate_speculative(req) : engine.generate_plain(req);
    EXPECT_EQ(res.finish, FinishReason::Stop);
    EXPECT_TRUE(matcher->matched());
    EXPECT_EQ(matcher->text().find(stop), std::string::npos);
    results.push_back(matcher->text());
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], text.substr(0, text.find(stop)));
}

}  // namespace
