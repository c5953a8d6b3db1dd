#include "server/openai_protocol.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tokenizer/utf8.h"

namespace dflash::server {
namespace {

using ojson = nlohmann::ordered_json;

const char* json_type(const ojson& j) {
  if (j.is_boolean()) return "a boolean";
  if (j.is_number()) return "a number";
  if (j.is_string()) return "a string";
  if (j.is_array()) return "an array";
  if (j.is_object()) return "an object";
  return "null";
}

ApiError wrong_type(const std::string& param, const char* expected, const ojson& got) {
  return bad_request(param + ": expected " + expected + ", got " + json_type(got), param, "invalid_type");
}

// Optional fields: absent and null both mean "not given", as in the OpenAI API.
const ojson* find(const ojson& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// An optional string field of `obj`; `param` names it in the error when it is another type.
std::optional<std::string> get_string(const ojson& obj, const char* name, const std::string& param) {
  const ojson* v = find(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw wrong_type(param, "a string", *v);
  return v->get<std::string>();
}

std::optional<int64_t> get_int(const ojson& body, const char* name) {
  const ojson* v = find(body, name);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) {
    if (v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      throw bad_request(std::string(name) + ": value too large", name);
    return static_cast<int64_t>(v->get<uint64_t>());
  }
  if (!v->is_number_integer()) throw wrong_type(name, "an integer", *v);
  return v->get<int64_t>();
}

// A number in [lo, hi]; `lo_open` excludes lo (top_p must be > 0).
std::optional<double> get_number(const ojson& body, const char* name, double lo, double hi, bool lo_open = false) {
  const ojson* v = find(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw wrong_type(name, "a number", *v);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
    const std::string range = (lo_open ? "(" : "[") + nlohmann::json(lo).dump() + ", " + nlohmann::json(hi).dump() + "]";
    throw bad_request(std::string(name) + " must be in " + range + ", got " + v->dump(), name);
  }
  return x;
}

std::optional<bool> get_bool(const ojson& body, const char* name) {
  const ojson* v = find(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw wrong_type(name, "a boolean", *v);
  return v->get<bool>();
}

ApiError unsupported(const std::string& param, const std::string& what) {
  return bad_request(what + " is not supported by this server", param, "unsupported_parameter");
}

// Options this server cannot honour are refused rather than silently ignored.
void reject_unsupported(const ojson& body, Endpoint e) {
  if (auto n = get_int(body, "n"); n && *n != 1)
    throw bad_request("n must be 1: this server returns one choice per request, got " + std::to_string(*n), "n",
                      "unsupported_parameter");
  if (auto b = get_int(body, "best_of"); b && *b != 1) throw unsupported("best_of", "best_of other than 1");
  if (get_bool(body, "echo").value_or(false)) throw unsupported("echo", "echo");
  if (const ojson* lp = find(body, "logprobs")) {
    const bool wanted = lp->is_boolean() ? lp->get<bool>() : lp->is_number() ? lp->get<double>() != 0 : true;
    if (wanted) throw unsupported("logprobs", "logprobs");
  }
  if (auto t = get_int(body, "top_logprobs"); t && *t != 0) throw unsupported("top_logprobs", "top_logprobs");
  if (const ojson* s = find(body, "suffix"); s && !(s->is_string() && s->get<std::string>().empty()))
    throw unsupported("suffix", "suffix");
  if (const ojson* t = find(body, "tools"); t && !(t->is_array() && t->empty())) throw unsupported("tools", "tools");
  if (const ojson* f = find(body, "functions"); f && !(f->is_array() && f->empty()))
    throw unsupported("functions", "functions");
  if (const ojson* rf = find(body, "response_format")) {
    if (!rf->is_object()) throw wrong_type("response_format", "an object", *rf);
    if (get_string(*rf, "type", "response_format.type").value_or("text") != "text")
      throw unsupported("response_format", "response_format other than {\"type\": \"text\"}");
  }
  (void)e;
}

std::string message_content(const ojson& content, const std::string& at) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw wrong_type(at, "a string or an array of content parts", content);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& part = content[i];
    const std::string pat = at + "[" + std::to_string(i) + "]";
    if (!part.is_object()) throw wrong_type(pat, "an object", part);
    const std::string type = get_string(part, "type", pat + ".type").value_or("");
    if (type != "text") throw bad_request(pat + ".type: only \"text\" parts are supported, got \"" + type + "\"", pat,
                                          "unsupported_content");
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) throw bad_request(pat + ".text: expected a string", pat, "invalid_type");
    if (!text.empty()) text += "\n";
    text += t->get<std::string>();
  }
  return text;
}

ojson parse_messages(const ojson& body) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) throw bad_request("messages is required", "messages", "missing_required_parameter");
  if (!it->is_array()) throw wrong_type("messages", "an array", *it);
  if (it->empty()) throw bad_request("messages must contain at least one message", "messages", "empty_messages");
  ojson out = ojson::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const ojson& m = (*it)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw wrong_type(at, "an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) throw bad_request(at + ".role: expected a string", at + ".role", "invalid_type");
    std::string r = role->get<std::string>();
    if (r != "system" && r != "developer" && r != "user" && r != "assistant" && r != "tool")
      throw bad_request(at + ".role: unknown role \"" + r + "\"", at + ".role", "invalid_role");
    if (r == "developer") r = "system";  // templates know "system"; OpenAI treats them alike
    auto content = m.find("content");
    std::string text;
    if (content != m.end() && !content->is_null()) {
      text = message_content(*content, at + ".content");
    } else if (r != "assistant") {
      throw bad_request(at + ".content is required", at + ".content", "missing_required_parameter");
    }
    ojson msg = {{"role", r}, {"content", text}};
    if (auto name = m.find("name"); name != m.end() && name->is_string()) msg["name"] = *name;
    out.push_back(std::move(msg));
  }
  return out;
}

void parse_prompt(const ojson& body, CompletionRequest& r) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) throw bad_request("prompt is required", "prompt", "missing_required_parameter");
  const ojson* p = &*it;
  // A list holding one prompt is one prompt; more would be a batch with several choices.
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
    return;
  }
  if (!p->is_array()) throw wrong_type("prompt", "a string or an array of token ids", *p);
  if (p->empty()) throw bad_request("prompt must not be empty", "prompt", "empty_prompt");
  for (const ojson& t : *p) {
    if (t.is_string() || t.is_array())
      throw bad_request("several prompts in one request are not supported (n = 1 only)", "prompt",
                        "unsupported_parameter");
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())
      throw bad_request("prompt: token ids must be non-negative integers, got " + t.dump(), "prompt", "invalid_type");
    r.prompt_ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
}

void parse_stop(const ojson& body, CompletionRequest& r) {
  const ojson* s = find(body, "stop");
  if (!s) return;
  auto add = [&](const ojson& v) {
    if (!v.is_string()) throw wrong_type("stop", "a string or an array of strings", v);
    std::string str = v.get<std::string>();
    if (str.size() > 1024) throw bad_request("stop: a stop string may be at most 1024 bytes", "stop");
    if (!str.empty()) r.stop.push_back(std::move(str));
  };
  if (s->is_array()) {
    if (s->size() > 16) throw bad_request("stop: at most 16 stop strings", "stop");
    for (const ojson& v : *s) add(v);
  } else {
    add(*s);
  }
}

void parse_sampling(const ojson& body, SamplingParams& p) {
  p.temperature = get_number(body, "temperature", 0, 2).value_or(1.0);
  p.top_p = get_number(body, "top_p", 0, 1, true).value_or(1.0);
  if (auto k = get_int(body, "top_k")) {
    if (*k < -1) throw bad_request("top_k must be -1 or 0 (off) or positive, got " + std::to_string(*k), "top_k");
    p.top_k = *k > std::numeric_limits<int>::max() ? 0 : static_cast<int>(std::max<int64_t>(*k, 0));
  }
  p.min_p = get_number(body, "min_p", 0, 1).value_or(0.0);
  p.presence_penalty = get_number(body, "presence_penalty", -2, 2).value_or(0.0);
  p.frequency_penalty = get_number(body, "frequency_penalty", -2, 2).value_or(0.0);
  if (const ojson* lb = find(body, "logit_bias")) {  // {"token id": bias in [-100, 100]}, as OpenAI's
    if (!lb->is_object()) throw wrong_type("logit_bias", "an object", *lb);
    for (const auto& [key, value] : lb->items()) {
      const std::string param = "logit_bias." + key;
      const bool digits = !key.empty() && key.size() <= 9 && std::all_of(key.begin(), key.end(), [](char c) {
        return c >= '0' && c <= '9';
      });
      if (!digits) throw bad_request("logit_bias: key \"" + key + "\" is not a token id", "logit_bias");
      if (!value.is_number()) throw wrong_type(param, "a number", value);
      const double bias = value.get<double>();
      if (!(bias >= -100 && bias <= 100))
        throw bad_request(param + " must be in [-100, 100], got " + value.dump(), "logit_bias");
      const int32_t id = std::stoi(key);
      if (std::any_of(p.logit_bias.begin(), p.logit_bias.end(), [&](const auto& b) { return b.first == id; }))
        throw bad_request("logit_bias: token id " + std::to_string(id) + " is given twice", "logit_bias");
      p.logit_bias.emplace_back(id, static_cast<float>(bias));
    }
  }
  p.repetition_penalty = get_number(body, "repetition_penalty", 0, 10, true).value_or(1.0);
  if (auto seed = get_int(body, "seed")) p.seed = static_cast<uint64_t>(*seed);
}

}  // namespace

CompletionRequest parse_completion_request(Endpoint endpoint, std::string_view body_text) {
  if (size_t bad = utf8::first_invalid(body_text); bad != std::string_view::npos)
    throw bad_request("the request body is not valid UTF-8 (byte offset " + std::to_string(bad) + ")", {},
                      "invalid_utf8");
  ojson body;
  try {
    body = ojson::parse(body_text);
  } catch (const nlohmann::json::exception& e) {
    // Syntax errors, and numbers past a double's range (1e999 is out_of_range, not parse_error):
    // both are the client's body.
    throw bad_request(std::string("the request body is not valid JSON: ") + e.what(), {}, "invalid_json");
  }
  if (!body.is_object()) throw bad_request("the request body must be a JSON object", {}, "invalid_json");

  CompletionRequest r;
  r.endpoint = endpoint;
  auto model = body.find("model");
  if (model == body.end() || model->is_null()) throw bad_request("model is required", "model", "missing_required_parameter");
  if (!model->is_string()) throw wrong_type("model", "a string", *model);
  r.model = model->get<std::string>();

  reject_unsupported(body, endpoint);
  if (endpoint == Endpoint::ChatCompletions) {
    r.messages = parse_messages(body);
    if (const ojson* kw = find(body, "chat_template_kwargs")) {
      if (!kw->is_object()) throw wrong_type("chat_template_kwargs", "an object", *kw);
      r.chat_template_kwargs = *kw;
    }
  } else {
    parse_prompt(body, r);
  }

  r.max_tokens = get_int(body, "max_tokens");
  const char* max_param = "max_tokens";
  if (auto mct = get_int(body, "max_completion_tokens")) {
    r.max_tokens = mct;
    max_param = "max_completion_tokens";
  }
  if (r.max_tokens && *r.max_tokens < 1)
    throw bad_request(std::string(max_param) + " must be at least 1, got " + std::to_string(*r.max_tokens), max_param);

  parse_sampling(body, r.sampling);
  parse_stop(body, r);
  r.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  r.stream = get_bool(body, "stream").value_or(false);
  if (const ojson* so = find(body, "stream_options")) {
    if (!so->is_object()) throw wrong_type("stream_options", "an object", *so);
    if (!r.stream) throw bad_request("stream_options is only allowed when stream is true", "stream_options");
    r.include_usage = get_bool(*so, "include_usage").value_or(false);
  }
  return r;
}

nlohmann::ordered_json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

namespace {
ojson head(Endpoint e, const ResponseMeta& m, bool chunk) {
  const char* object = e == Endpoint::ChatCompletions ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                      : "text_completion";
  return {{"id", m.id}, {"object", object}, {"created", m.created}, {"model", m.model}};
}
ojson reason_json(const std::string& r) { return r.empty() ? ojson(nullptr) : ojson(r); }
}  // namespace

nlohmann::ordered_json completion_response(Endpoint e, const ResponseMeta& m, const std::string& text,
                                           const std::string& finish_reason, const Usage& u) {
  ojson j = head(e, m, false);
  ojson choice = {{"index", 0}};
  if (e == Endpoint::ChatCompletions)
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  else
    choice["text"] = text;
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = reason_json(finish_reason);
  j["choices"] = ojson::array({choice});
  j["usage"] = usage_json(u);
  return j;
}

nlohmann::ordered_json stream_chunk(Endpoint e, const ResponseMeta& m, const std::string& text,
                                    const std::string& finish_reason, bool first, bool include_usage) {
  ojson j = head(e, m, true);
  ojson choice = {{"index", 0}};
  if (e == Endpoint::ChatCompletions) {
    ojson delta = ojson::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && finish_reason.empty())) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = reason_json(finish_reason);
  j["choices"] = ojson::array({choice});
  if (include_usage) j["usage"] = nullptr;
  return j;
}

nlohmann::ordered_json usage_chunk(Endpoint e, const ResponseMeta& m, const Usage& u) {
  ojson j = head(e, m, true);
  j["choices"] = ojson::array();
  j["usage"] = usage_json(u);
  return j;
}

nlohmann::ordered_json error_json(const ApiError& e) {
  auto opt = [](const std::string& s) { return s.empty() ? ojson(nullptr) : ojson(s); };
  return {{"error", {{"message", std::string(e.what())}, {"type", e.type}, {"param", opt(e.param)}, {"code", opt(e.code)}}}};
}

std::string sse_event(const nlohmann::ordered_json& j) {
  // Replacing invalid UTF-8 keeps dump() from throwing; our text is valid, this is a backstop.
  return "data: " + j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

}  // namespace dflash::server
