#pragma once
// From a parsed request to engine input: the chat template or the plain text through the
// tokenizer, and the token budget checked against the context.
#include <cstdint>
#include <vector>

#include "server/openai_protocol.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace dflash::server {

struct PromptLimits {
  int vocab_size = 0;
  int64_t context_length = 0;
  int64_t default_max_tokens = 0;  // chat default; 0: the rest of the context
  // --chat-template: replaces the tokenizer's (code models often ship none).
  const ChatTemplate* chat_template = nullptr;
};

struct PreparedPrompt {
  std::vector<int32_t> ids;
  int max_tokens = 0;
};

// Throws ApiError 400 (empty prompt, unknown token id, template failure, context exceeded).
PreparedPrompt prepare_prompt(const CompletionRequest& r, const Tokenizer& tokenizer, const PromptLimits& limits);

}  // namespace dflash::server
