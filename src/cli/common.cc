#include "cli/common.h"

#include <cblas.h>
#include <omp.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "cli/validators.h"
#include "util/error.h"

namespace dflash::cli {

SamplingParams SamplingArgs::params() const {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repetition_penalty = repetition_penalty;
  p.presence_penalty = presence_penalty;
  p.frequency_penalty = frequency_penalty;
  p.seed = seed;
  for (const std::string& b : logit_bias) {
    const size_t colon = b.find(':');
    size_t id_end = 0, bias_end = 0;
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no colon");
      const int id = std::stoi(b.substr(0, colon), &id_end);
      const float bias = std::stof(b.substr(colon + 1), &bias_end);
      if (id_end != colon || bias_end != b.size() - colon - 1) throw std::invalid_argument("trailing characters");
      p.logit_bias.emplace_back(id, bias);
    } catch (const std::logic_error&) {
      throw Error("--logit-bias " + b + ": expected TOKEN_ID:BIAS, for example 151643:-100");
    }
  }
  return p;
}

std::vector<int32_t> LoadedModels::eos_ids() const {
  std::vector<int32_t> ids;
  for (int id : target->generation_config().eos_token_ids) ids.push_back(id);
  return ids;
}

void add_model_options(CLI::App& app, ModelArgs& a) {
  app.add_option("-m,--model", a.model_dir, "Target model directory (Hugging Face layout)")->required();
  app.add_option("-d,--draft", a.draft_dir, "DFlash drafter directory: enables speculative decoding");
  app.add_option("--device", a.device, "cpu, cuda or auto")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("-b,--block-size", a.block_size, "Most rows verified per speculative step (2 to 32; default: the drafter's block). The drafter always drafts at least the block it was trained on")
      ->check(CLI::Range(2, 32));
  app.add_option("-c,--ctx-size", a.context_length, "Context length (default: the model's maximum)")
      ->check(positive());
  app.add_flag("--no-adaptive", a.no_adaptive, "Keep the block size fixed even when speculation does not pay");
  app.add_option("-t,--threads", a.threads, "CPU threads (default: all cores)")->check(non_negative());
  app.add_option("--forced-acceptance", a.forced_acceptance,
                 "BENCHMARK ONLY: commit exactly this many tokens per step whatever the target says "
                 "(output is not the target's)")
      ->check(CLI::Range(1, 32));
}

void add_prompt_options(CLI::App& app, PromptArgs& a) {
  app.add_option("-p,--prompt", a.text, "Prompt text");
  app.add_option("--prompt-ids", a.ids, "Prompt as comma-separated token ids");
  app.add_flag("--chat", a.chat, "Render the prompt as a user turn with the model's chat template");
  app.add_option("--system", a.system, "System message (with --chat)");
  app.add_flag("--no-think", a.no_think, "enable_thinking=false in the chat template (Qwen3)");
  app.add_option("--stop", a.stop, "Stop string (repeatable)");
}

void add_sampling_options(CLI::App& app, SamplingArgs& a) {
  app.add_option("--temperature", a.temperature, "0 = greedy")->check(non_negative());
  app.add_option("--top-k", a.top_k, "0 = off")->check(non_negative());
  app.add_option("--top-p", a.top_p)->check(CLI::Range(0.0, 1.0));
  app.add_option("--min-p", a.min_p)->check(CLI::Range(0.0, 1.0));
  app.add_option("--repetition-penalty", a.repetition_penalty);
  app.add_option("--presence-penalty", a.presence_penalty, "subtracted from each token the output holds");
  app.add_option("--frequency-penalty", a.frequency_penalty, "times the number of times the output holds the token, subtracted");
  app.add_option("--logit-bias", a.logit_bias, "TOKEN_ID:BIAS added to that token's logit (repeat for more tokens)");
  app.add_option("--seed", a.seed);
}

LoadedModels load_models(const ModelArgs& a) {
  if (a.threads > 0) {
    omp_set_num_threads(a.threads);
    openblas_set_num_threads(a.threads);
  }
  LoadedModels m;
  m.backend = make_backend(a.device);
  m.target = Qwen3Model::load(a.model_dir, *m.backend);
  if (std::filesystem::exists(std::filesystem::path(a.model_dir) / "tokenizer.json"))
    m.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_dir(a.model_dir));
  if (!a.draft_dir.empty()) {
    std::vector<std::string> warnings;
    m.drafter = DFlashDrafter::load(a.draft_dir, *m.target, &warnings);
    for (const auto& w : warnings) std::fprintf(stderr, "WARNING: %s\n", w.c_str());
  }
  EngineOptions opts;
  opts.block_size = a.block_size;
  opts.context_length = a.context_length;
  opts.adaptive = !a.no_adaptive && a.forced_acceptance == 0;
  opts.forced_acceptance = a.forced_acceptance;
  m.engine = std::make_unique<Engine>(*m.target, m.drafter.get(), opts);
  return m;
}

std::vector<int32_t> parse_token_ids(const std::string& csv) {
  std::vector<int32_t> ids;
  std::stringstream ss(csv);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    long v = 0;
    try {
      v = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 0 || v > INT32_MAX) throw Error("--prompt-ids: '" + item + "' is not a token id");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

std::vector<int32_t> encode_prompt(const std::string& text, bool chat, const std::string& system, bool no_think,
                                   const LoadedModels& m) {
  if (!m.tokenizer)
    throw Error(m.target->dir() + ": no tokenizer.json, so text prompts cannot be encoded; use --prompt-ids");
  if (!chat) return m.tokenizer->encode(text);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  messages.push_back({{"role", "user"}, {"content", text}});
  ChatOptions opts;
  if (no_think) opts.enable_thinking = false;
  EncodeOptions enc;
  enc.add_special_tokens = false;  // the template already wrote them
  return m.tokenizer->encode(m.tokenizer->apply_chat_template(messages, opts), enc);
}

std::vector<int32_t> resolve_prompt(const PromptArgs& a, const LoadedModels& m) {
  if (!a.ids.empty() && !a.text.empty()) throw Error("give either --prompt or --prompt-ids, not both");
  if (!a.ids.empty()) return parse_token_ids(a.ids);
  if (!a.text.empty()) return encode_prompt(a.text, a.chat, a.system, a.no_think, m);
  throw Error("give a prompt with --prompt or --prompt-ids");
}

std::shared_ptr<StopStringMatcher> attach_stop_strings(GenerationRequest& req, const std::vector<std::string>& stop,
                                                       const LoadedModels& m) {
  if (stop.empty()) return nullptr;
  if (!m.tokenizer) throw Error(m.target->dir() + ": --stop needs a tokenizer.json in the model directory");
  auto matcher = std::make_shared<StopStringMatcher>(*m.tokenizer, stop);
  req.stop_check = [matcher](const std::vector<int32_t>& out) { return matcher->update(out); };
  return matcher;
}

std::string render_output(const std::vector<int32_t>& tokens, const LoadedModels& m,
                          const std::shared_ptr<StopStringMatcher>& stop) {
  if (stop && stop->matched()) return stop->text();
  if (m.tokenizer) return m.tokenizer->decode(tokens);
  std::string s;
  for (size_t i = 0; i < tokens.size(); ++i) s += (i ? "," : "") + std::to_string(tokens[i]);
  return s;
}

}  // namespace dflash::cli
