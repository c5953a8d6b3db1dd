// libFuzzer target over what the server does with a request body before the engine sees it:
// parse_completion_request (both endpoints) and prepare_prompt (the chat template, the
// tokenizer, the context check), with the error written as the HTTP layer writes it. Any body
// must either become a prompt whose invariants hold or fail with an ApiError whose JSON can be
// written; nothing else may escape, and nothing may crash. The first byte picks the endpoint
// (bit 0) and whether the body is the input's bytes (bit 1) or a valid request of that endpoint
// with the input's edits (json_edits.h).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz_checks.h"
#include "json_edits.h"
#include "server/openai_protocol.h"
#include "server/prompt.h"
#include "tokenizer/tokenizer.h"

namespace {

using dflash::server::ApiError;
using dflash::server::Endpoint;
using dflash::fuzz::check;

// Qwen3's tokenizer ships a chat template, so chat bodies reach the renderer.
const dflash::Tokenizer& tokenizer() {
  static const dflash::Tokenizer tok = dflash::Tokenizer::from_dir(DFLASH_TOKENIZER_DATA "/qwen3");
  return tok;
}

constexpr int64_t kContext = 256;

// The HTTP layer answers with error_json(e), dumped with invalid UTF-8 replaced (a message may
// quote the user's bytes cut in the middle of a character: nlohmann's parse errors do). What
// goes on the wire must parse back as JSON.
void check_error(const ApiError& e) {
  check(e.status >= 400 && e.status < 600, "error status outside 4xx/5xx");
  check(std::string(e.what()).size() > 0, "empty error message");
  const std::string wire =
      dflash::server::error_json(e).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  check(nlohmann::json::accept(wire), "error JSON does not parse back");
}

void fuzz_body(Endpoint endpoint, const std::string& body) {
  dflash::server::CompletionRequest r;
  try {
    r = dflash::server::parse_completion_request(endpoint, body);
  } catch (const ApiError& e) {
    check_error(e);
    return;
  }
  const auto& tok = tokenizer();
  dflash::server::PromptLimits limits;
  limits.vocab_size = static_cast<int>(tok.vocab_size());
  limits.context_length = kContext;
  dflash::server::PreparedPrompt p;
  try {
    p = dflash::server::prepare_prompt(r, tok, limits);
  } catch (const ApiError& e) {
    check_error(e);
    return;
  }
  // Accepted: the engine may take it as it is.
  check(!p.ids.empty(), "empty prompt accepted");
  for (int32_t id : p.ids) check(id >= 0 && id < limits.vocab_size, "token id outside the vocabulary accepted");
  check(p.max_tokens >= 1, "no room to generate accepted");
  check(int64_t(p.ids.size()) + p.max_tokens <= kContext, "prompt and max_tokens past the context accepted");
  for (const auto& [id, bias] : r.sampling.logit_bias) {
    check(id >= 0 && id < limits.vocab_size, "logit_bias id outside the vocabulary accepted");
    check(bias >= -100 && bias <= 100, "logit_bias outside [-100, 100] accepted");
  }
  check(r.sampling.temperature >= 0 && r.sampling.top_p > 0 && r.sampling.top_p <= 1, "sampling parameter out of range");
}

// A request of each endpoint with every field the parser reads, and those fields, for the edits.
const nlohmann::json kCompletion = {
    {"model", "m"}, {"prompt", "def f(x):"}, {"max_tokens", 8}, {"temperature", 0.7}, {"top_p", 0.9},
    {"top_k", 5}, {"min_p", 0.1}, {"presence_penalty", 0.5}, {"frequency_penalty", 0.5},
    {"repetition_penalty", 1.1}, {"logit_bias", {{"42", -100}}}, {"stop", {"\n\n"}}, {"stream", true},
    {"stream_options", {{"include_usage", true}}}, {"seed", 7}, {"ignore_eos", false}, {"n", 1}, {"echo", false}};
const nlohmann::json kChat = {
    {"model", "m"},
    {"messages", {{{"role", "system"}, {"content", "Be brief."}},
                  {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hi"}}}}}}},
    {"max_completion_tokens", 16}, {"chat_template_kwargs", {{"enable_thinking", false}}}, {"temperature", 0.0}};
const std::vector<std::string> kFields = {
    "/model", "/prompt", "/prompt/0", "/max_tokens", "/max_completion_tokens", "/temperature", "/top_p",
    "/top_k", "/min_p", "/presence_penalty", "/frequency_penalty", "/repetition_penalty", "/logit_bias",
    "/logit_bias/42", "/stop", "/stop/0", "/stream", "/stream_options", "/stream_options/include_usage",
    "/seed", "/ignore_eos", "/n", "/echo", "/logprobs", "/best_of", "/suffix", "/tools", "/response_format",
    "/messages", "/messages/0", "/messages/0/role", "/messages/0/content", "/messages/1/content",
    "/messages/1/content/0", "/messages/1/content/0/type", "/messages/1/content/0/text", "/messages/2",
    "/chat_template_kwargs", "/chat_template_kwargs/enable_thinking"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Endpoint endpoint = data[0] & 1 ? Endpoint::ChatCompletions : Endpoint::Completions;
  if (data[0] & 2) {
    // A copy of exactly the body, so that ASan sees any read past its end.
    fuzz_body(endpoint, std::string(reinterpret_cast<const char*>(data + 1), size - 1));
  } else {
    nlohmann::json doc = endpoint == Endpoint::ChatCompletions ? kChat : kCompletion;
    dflash::fuzz::apply_json_edits(doc, kFields, data + 1, size - 1);
    fuzz_body(endpoint, doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  return 0;
}
