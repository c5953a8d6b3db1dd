// libFuzzer target over what the server does with a request body before the engine sees it:
// parse_completion_request (both endpoints) and prepare_prompt (the chat template, the
// tokenizer, the context check), with the error written as the HTTP layer writes it. Any body
// must either become a prompt whose invariants hold or fail with an ApiError whose JSON can be
// written; nothing else may escape, and nothing may crash. The first byte picks the endpoint.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_checks.h"
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Endpoint endpoint = data[0] % 2 ? Endpoint::ChatCompletions : Endpoint::Completions;
  // A copy of exactly the body, so that ASan sees any read past its end.
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  fuzz_body(endpoint, body);
  return 0;
}
