#include "server/prompt.h"

#include <algorithm>

#include "util/error.h"

namespace dflash::server {
namespace {

// OpenAI's legacy completions endpoint generates 16 tokens unless told otherwise.
constexpr int64_t kCompletionsDefaultMaxTokens = 16;

std::string render_chat(const CompletionRequest& r, const Tokenizer& tok, const ChatTemplate* override_template) {
  const auto& kwargs = r.chat_template_kwargs;
  if (!override_template) {
    if (tok.chat_template().empty())
      throw bad_request("this model has no chat template (start the server with --chat-template); use /v1/completions",
                        "messages", "no_chat_template");
    ChatOptions opts;
    if (kwargs.is_object()) {
      opts.extra = &kwargs;
      if (auto it = kwargs.find("enable_thinking"); it != kwargs.end() && it->is_boolean())
        opts.enable_thinking = it->get<bool>();
    }
    return tok.apply_chat_template(r.messages, opts);
  }
  // The variables transformers passes, as Tokenizer::apply_chat_template sets them.
  nlohmann::ordered_json vars = kwargs.is_object() ? kwargs : nlohmann::ordered_json::object();
  vars["messages"] = r.messages;
  vars["add_generation_prompt"] = true;
  if (!tok.bos_token().empty()) vars["bos_token"] = tok.bos_token();
  if (!tok.eos_token().empty()) vars["eos_token"] = tok.eos_token();
  return override_template->render(vars);
}

std::vector<int32_t> encode_chat(const CompletionRequest& r, const Tokenizer& tok, const ChatTemplate* override_template) {
  std::string text;
  try {
    text = render_chat(r, tok, override_template);
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    // Templates raise on conversations they do not accept (roles out of order, ...).
    throw bad_request(std::string("the chat template rejected the messages: ") + e.what(), "messages",
                      "chat_template_error");
  }
  EncodeOptions enc;
  enc.add_special_tokens = false;  // the template wrote them
  return tok.encode(text, enc);
}

}  // namespace

PreparedPrompt prepare_prompt(const CompletionRequest& r, const Tokenizer& tok, const PromptLimits& limits) {
  const bool chat = r.endpoint == Endpoint::ChatCompletions;
  const char* prompt_param = chat ? "messages" : "prompt";
  PreparedPrompt p;
  if (chat) {
    p.ids = encode_chat(r, tok, limits.chat_template);
  } else if (r.prompt_text) {
    try {
      p.ids = tok.encode(*r.prompt_text);
    } catch (const Error& e) {
      throw bad_request(std::string("prompt: ") + e.what(), "prompt", "invalid_utf8");
    }
  } else {
    p.ids = r.prompt_ids;
  }
  const bool ids_given = !chat && !r.prompt_text;
  for (int32_t id : p.ids)
    if (id >= limits.vocab_size)
      // Text whose ids the model lacks means the tokenizer was made for another model; saying
      // so here names the parameter, where the engine's own check could only name the id.
      throw bad_request(ids_given ? "prompt: token id " + std::to_string(id) + " is outside the vocabulary (0 ... " +
                                        std::to_string(limits.vocab_size - 1) + ")"
                                  : std::string(prompt_param) + ": the tokenizer gave token id " + std::to_string(id) +
                                        ", which this model's embedding lacks (vocab_size " +
                                        std::to_string(limits.vocab_size) + "): the tokenizer and model do not match",
                        prompt_param, "invalid_token_id");
  if (p.ids.empty()) throw bad_request("the prompt is empty: at least one token is needed", prompt_param, "empty_prompt");
  for (const auto& [id, bias] : r.sampling.logit_bias)
    if (id >= limits.vocab_size)
      throw bad_request("logit_bias: token id " + std::to_string(id) + " is outside the vocabulary (0 ... " +
                            std::to_string(limits.vocab_size - 1) + ")",
                        "logit_bias", "invalid_token_id");

  const int64_t n = static_cast<int64_t>(p.ids.size());
  const int64_t ctx = limits.context_length;
  if (n >= ctx)
    throw bad_request("the prompt has " + std::to_string(n) + " tokens; this model's context is " +
                          std::to_string(ctx) + " tokens, which leaves no room to generate",
                      prompt_param, "context_length_exceeded");
  const int64_t room = ctx - n;
  int64_t max_tokens;
  if (r.max_tokens) {
    max_tokens = *r.max_tokens;
    if (max_tokens > room)
      throw bad_request("this model's context is " + std::to_string(ctx) + " tokens; the prompt has " +
                            std::to_string(n) + " and max_tokens asks for " + std::to_string(max_tokens) +
                            " more (at most " + std::to_string(room) + " fit)",
                        "max_tokens", "context_length_exceeded");
  } else if (!chat) {
    max_tokens = std::min(room, kCompletionsDefaultMaxTokens);
  } else {
    max_tokens = limits.default_max_tokens > 0 ? std::min(room, limits.default_max_tokens) : room;
  }
  p.max_tokens = static_cast<int>(std::min<int64_t>(max_tokens, INT32_MAX));
  return p;
}

}  // namespace dflash::server
