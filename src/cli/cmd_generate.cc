// dflash generate: one request, plain or speculative, with the acceptance statistics.
#include <cstdio>
#include <sstream>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/validators.h"
#include "engine/generation.h"

namespace dflash::cli {
namespace {

struct GenerateArgs {
  ModelArgs model;
  PromptArgs prompt;
  SamplingArgs sampling;
  int max_new_tokens = 128;
  bool ignore_eos = false;
  bool compare_plain = false;
  bool json = false;
};

int run_generate(GenerateArgs& a) {
  LoadedModels m = load_models(a.model);
  GenerationRequest req;
  req.prompt = resolve_prompt(a.prompt, m);
  req.max_new_tokens = a.max_new_tokens;
  req.sampling = a.sampling.params();
  if (!a.ignore_eos) req.eos_ids = m.eos_ids();
  auto stop = attach_stop_strings(req, a.prompt.stop, m);

  GenerationResult res = m.engine->generate(req);
  std::printf("%s\n", render_output(res.tokens, m, stop).c_str());
  std::fprintf(stderr, "finish: %s\n%s", finish_reason_name(res.finish), res.stats.to_text().c_str());
  if (a.compare_plain && m.drafter) {
    GenerationResult plain = m.engine->generate_plain(req);
    const double spec_tps = res.stats.decode_tokens_per_second(), plain_tps = plain.stats.decode_tokens_per_second();
    std::fprintf(stderr, "plain decoding: %.1f tokens/s; speculative: %.1f tokens/s; speedup %.2fx; outputs %s\n",
                 plain_tps, spec_tps, plain_tps > 0 ? spec_tps / plain_tps : 0.0,
                 plain.tokens == res.tokens ? "identical" : "DIFFER");
  }
  return 0;
}

RegisterCommand reg("generate", "Generate text from a prompt (DFlash speculative decoding with --draft)",
                    [](CLI::App& sub) -> std::function<int()> {
  auto a = std::make_shared<GenerateArgs>();
  add_model_options(sub, a->model);
  add_prompt_options(sub, a->prompt);
  add_sampling_options(sub, a->sampling);
  sub.add_option("-n,--max-new-tokens", a->max_new_tokens, "Tokens to generate at most")->check(positive());
  sub.add_flag("--ignore-eos", a->ignore_eos, "Do not stop at end-of-sequence tokens");
  sub.add_flag("--compare-plain", a->compare_plain, "Also run plain decoding and print the speedup");
  return [a] { return run_generate(*a); };
});

}  // namespace
}  // namespace dflash::cli
