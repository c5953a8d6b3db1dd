#pragma once
// Options and loading shared by the subcommands that run a model (generate, bench, serve).
#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/generation.h"
#include "engine/stop_strings.h"
#include "tokenizer/tokenizer.h"
#include "model/dflash_drafter.h"
#include "model/qwen3.h"

namespace dflash::cli {

struct ModelArgs {
  std::string model_dir;
  std::string draft_dir;
  std::string device = "cpu";
  int block_size = 0;
  int64_t context_length = 0;
  bool no_adaptive = false;
  int threads = 0;
  int forced_acceptance = 0;
};

struct PromptArgs {
  std::string text;
  std::string ids;  // comma-separated token ids
  bool chat = false;  // wrap the text as a user turn with the model's chat template
  std::string system;
  bool no_think = false;  // chat templates with enable_thinking (Qwen3)
  std::vector<std::string> stop;
};

struct SamplingArgs {
  double temperature = 0.0, top_p = 1.0, min_p = 0.0, repetition_penalty = 1.0, presence_penalty = 0.0,
         frequency_penalty = 0.0;
  int top_k = 0;
  uint64_t seed = 0;
  std::vector<std::string> logit_bias;  // "ID:BIAS", as given
  SamplingParams params() const;  // throws dflash::Error naming a malformed --logit-bias
};

struct LoadedModels {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Qwen3Model> target;
  std::unique_ptr<DFlashDrafter> drafter;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Tokenizer> tokenizer;  // when the model directory has tokenizer.json
  std::vector<int32_t> eos_ids() const;
};

void add_model_options(CLI::App& app, ModelArgs& a);
void add_prompt_options(CLI::App& app, PromptArgs& a);
void add_sampling_options(CLI::App& app, SamplingArgs& a);

LoadedModels load_models(const ModelArgs& a);
std::vector<int32_t> parse_token_ids(const std::string& csv);
std::vector<int32_t> resolve_prompt(const PromptArgs& a, const LoadedModels& m);
// Text of a chat prompt or plain prompt; exposed for bench prompt files.
std::vector<int32_t> encode_prompt(const std::string& text, bool chat, const std::string& system, bool no_think,
                                   const LoadedModels& m);
// Stop strings need the tokenizer; the matcher it returns also cuts the output text.
std::shared_ptr<StopStringMatcher> attach_stop_strings(GenerationRequest& req, const std::vector<std::string>& stop,
                                                       const LoadedModels& m);
// Decoded text (cut at a matched stop string), or the ids when the model has no tokenizer.
std::string render_output(const std::vector<int32_t>& tokens, const LoadedModels& m,
                          const std::shared_ptr<StopStringMatcher>& stop = nullptr);

}  // namespace dflash::cli
