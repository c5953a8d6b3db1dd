#pragma once
// The OpenAI wire format: parsing and validating /v1/completions and /v1/chat/completions
// bodies into one request shape, and writing responses, stream chunks and errors. Pure JSON:
// nothing here touches the tokenizer or the engine.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampling.h"
#include "server/api_error.h"

namespace dflash::server {

enum class Endpoint { Completions, ChatCompletions };

struct CompletionRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::string model;
  // Completions: text, or token ids when the prompt was given as integers.
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;
  // Chat: messages normalised for the template (content always a string).
  nlohmann::ordered_json messages;
  nlohmann::ordered_json chat_template_kwargs;  // object or null
  std::optional<int64_t> max_tokens;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // vLLM's extension: generate past end-of-sequence tokens
};

// Throws ApiError (400) for malformed JSON, invalid UTF-8, wrong types, out-of-range values
// and unsupported options.
CompletionRequest parse_completion_request(Endpoint endpoint, std::string_view body);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// What the responses share: "id", "created", "model".
struct ResponseMeta {
  std::string id;
  int64_t created = 0;
  std::string model;
};

nlohmann::ordered_json usage_json(const Usage& u);
nlohmann::ordered_json completion_response(Endpoint e, const ResponseMeta& m, const std::string& text,
                                           const std::string& finish_reason, const Usage& u);
// One SSE chunk; `finish_reason` empty → null. The first chat chunk carries the role.
nlohmann::ordered_json stream_chunk(Endpoint e, const ResponseMeta& m, const std::string& text,
                                    const std::string& finish_reason, bool first, bool include_usage);
// The final chunk of stream_options.include_usage: no choices, only usage.
nlohmann::ordered_json usage_chunk(Endpoint e, const ResponseMeta& m, const Usage& u);

nlohmann::ordered_json error_json(const ApiError& e);
std::string sse_event(const nlohmann::ordered_json& j);  // "data: {...}\n\n"

}  // namespace dflash::server
