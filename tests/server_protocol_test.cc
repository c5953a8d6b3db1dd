// Server pieces without HTTP: request parsing and validation, the stop-string-safe text
// stream, prompt budgeting and queue admission.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "server/openai_protocol.h"
#include "server/prompt.h"
#include "server/request_queue.h"
#include "server/text_stream.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace dflash::server {
namespace {

const Tokenizer& byte_tokenizer() {
  static Tokenizer t = Tokenizer::from_dir(test::source_path("testdata/server/byte-tokenizer"));
  return t;
}

ApiError parse_error(Endpoint e, const std::string& body) {
  try {
    parse_completion_request(e, body);
  } catch (const ApiError& err) {
    return err;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "", "", "");
}

TEST(ServerProtocol, ParsesChatRequest) {
  auto r = parse_completion_request(Endpoint::ChatCompletions, R"({"model": "m", "messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
      "max_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": -1, "seed": 3, "stop": "x",
      "stream": true, "stream_options": {"include_usage": true}, "n": 1, "user": "ignored",
      "frequency_penalty": 0.25, "presence_penalty": -0.5, "repetition_penalty": 1.1,
      "logit_bias": {"42": -100, "7": 2.5}})");
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "a\nb");
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_TRUE(r.sampling.greedy());
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_EQ(r.sampling.seed, 3u);
  EXPECT_EQ(r.sampling.frequency_penalty, 0.25);
  EXPECT_EQ(r.sampling.presence_penalty, -0.5);
  EXPECT_EQ(r.sampling.repetition_penalty, 1.1);
  EXPECT_EQ(r.sampling.logit_bias, (std::vector<std::pair<int32_t, float>>{{42, -100.f}, {7, 2.5f}}));
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.stream && r.include_usage);
}

TEST(ServerProtocol, ParsesCompletionPrompts) {
  EXPECT_EQ(*parse_completion_request(Endpoint::Completions, R"({"model":"m","prompt":"hi"})").prompt_text, "hi");
  EXPECT_EQ(*parse_completion_request(Endpoint::Completions, R"({"model":"m","prompt":["hi"]})").prompt_text, "hi");
  auto ids = parse_completion_request(Endpoint::Completions, R"({"model":"m","prompt":[[1,2,3]]})").prompt_ids;
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 3}));
  // Absent sampling fields take OpenAI's defaults; null means absent.
  auto r = parse_completion_request(Endpoint::Completions, R"({"model":"m","prompt":"x","temperature":null})");
  EXPECT_EQ(r.sampling.temperature, 1.0);
  EXPECT_FALSE(r.max_tokens);
}

TEST(ServerProtocol, RejectsBadRequests) {
  struct Case {
    Endpoint e;
    const char* body;
    const char* code;
    const char* param;
  };
  const Endpoint C = Endpoint::Completions, X = Endpoint::ChatCompletions;
  const Case cases[] = {
      {X, "{", "invalid_json", ""},
      {X, "null", "invalid_json", ""},
      // A number past a double's range is nlohmann's out_of_range, not a parse_error: still the
      // client's body (it was a 500 before fuzz_server_request found it).
      {C, R"({"model":"m","prompt":"x","temperature":3e999})", "invalid_json", ""},
      // A content part's or response_format's "type" of another type than a string was read with
      // nlohmann's value() and escaped as its type_error, a 500 (fuzz_server_request's edits).
      {X, R"({"model":"m","messages":[{"role":"user","content":[{"type":7,"text":"x"}]}]})", "invalid_type",
       "messages[0].content[0].type"},
      {X, R"({"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":1}})", "invalid_type",
       "response_format.type"},
      {X, "\"\xc3\x28\"", "invalid_utf8", ""},
      {X, R"({"messages":[{"role":"user","content":"x"}]})", "missing_required_parameter", "model"},
      {X, R"({"model":1})", "invalid_type", "model"},
      {X, R"({"model":"m","messages":{}})", "invalid_type", "messages"},
      {X, R"({"model":"m","messages":[]})", "empty_messages", "messages"},
      {X, R"({"model":"m","messages":[{"content":"x"}]})", "invalid_type", "messages[0].role"},
      {X, R"({"model":"m","messages":[{"role":"user","content":null}]})", "missing_required_parameter", "messages[0].content"},
      {X, R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":0})", "invalid_value",
       "max_completion_tokens"},
      {X, R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":true})", "invalid_type", "max_tokens"},
      {X, R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1e30})", "invalid_type", "max_tokens"},
      {X, R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":2.5})", "invalid_value", "temperature"},
      {X, R"({"model":"m","messages":[{"role":"user","content":"x"}],"min_p":-0.1})", "invalid_value", "min_p"},
      {X, R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":2})", "unsupported_parameter", "n"},
      {X, R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{}]})", "unsupported_parameter", "tools"},
      {X, R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":[1]})", "invalid_type", "stop"},
      {X, R"({"model":"m","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":1})", "invalid_type",
       "chat_template_kwargs"},
      {C, R"({"model":"m","prompt":[1,"a"]})", "unsupported_parameter", "prompt"},
      {C, R"({"model":"m","prompt":[1.5]})", "invalid_type", "prompt"},
      {C, R"({"model":"m","prompt":"x","best_of":2})", "unsupported_parameter", "best_of"},
      {C, R"({"model":"m","prompt":"x","logit_bias":[1]})", "invalid_type", "logit_bias"},
      {C, R"({"model":"m","prompt":"x","logit_bias":{"a1":1}})", "invalid_value", "logit_bias"},
      {C, R"({"model":"m","prompt":"x","logit_bias":{"-3":1}})", "invalid_value", "logit_bias"},
      {C, R"({"model":"m","prompt":"x","logit_bias":{"3":"x"}})", "invalid_type", "logit_bias.3"},
      {C, R"({"model":"m","prompt":"x","logit_bias":{"3":101}})", "invalid_value", "logit_bias"},
      {C, R"({"model":"m","prompt":"x","logit_bias":{"3":1,"03":2}})", "invalid_value", "logit_bias"},
      {C, R"({"model":"m","prompt":"x","logprobs":2})", "unsupported_parameter", "logprobs"},
      {C, R"({"model":"m","prompt":"x","suffix":"y"})", "unsupported_parameter", "suffix"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body);
    ApiError err = parse_error(c.e, c.body);
    EXPECT_EQ(err.status, 400);
    EXPECT_EQ(err.type, "invalid_request_error");
    EXPECT_EQ(err.code, c.code);
    EXPECT_EQ(err.param, c.param);
  }
}

TEST(ServerProtocol, ErrorAndChunkShapes) {
  auto j = error_json(bad_request("nope", "max_tokens"));
  EXPECT_EQ(j.dump(), R"({"error":{"message":"nope","type":"invalid_request_error","param":"max_tokens","code":"invalid_value"}})");
  ResponseMeta m{"id1", 5, "m"};
  auto first = stream_chunk(Endpoint::ChatCompletions, m, "", "", true, false);
  EXPECT_EQ(first["choices"][0]["delta"].dump(), R"({"role":"assistant","content":""})");
  auto last = stream_chunk(Endpoint::ChatCompletions, m, "", "stop", false, true);
  EXPECT_EQ(last["choices"][0]["delta"].dump(), "{}");
  EXPECT_TRUE(last["usage"].is_null());
  EXPECT_EQ(sse_event({{"a", 1}}), "data: {\"a\":1}\n\n");
}

std::vector<int32_t> bytes_of(const std::string& s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

// Feeds one token at a time; returns every piece.
std::vector<std::string> stream_pieces(TextStream& ts, const std::string& bytes, std::string* all) {
  std::vector<std::string> pieces;
  for (int32_t id : bytes_of(bytes)) {
    pieces.push_back(ts.push(&id, 1));
    *all += pieces.back();
  }
  pieces.push_back(ts.finish());
  *all += pieces.back();
  return pieces;
}

TEST(ServerTextStream, NeverSplitsCharactersOrPassesAStop) {
  const std::string text = "a\xc3\xa9" "b\xe2\x9c\x93" "cSTOPd";  // aébcSTOPd with ✓
  TextStream ts(byte_tokenizer(), {"STOP", "zz"});
  std::string all;
  for (const auto& piece : stream_pieces(ts, text, &all)) {
    EXPECT_EQ(utf8::first_invalid(piece), std::string::npos) << piece;
    EXPECT_EQ(piece.find('S'), std::string::npos) << "a prefix of the stop string escaped: " << piece;
  }
  EXPECT_TRUE(ts.stopped());
  EXPECT_EQ(all, "a\xc3\xa9" "b\xe2\x9c\x93" "c");
  EXPECT_EQ(ts.sent_text(), all);
}

TEST(ServerTextStream, HeldBackTailIsReleasedAtTheEnd) {
  TextStream ts(byte_tokenizer(), {"xyz"});
  std::string all;
  auto pieces = stream_pieces(ts, "abxy", &all);
  EXPECT_EQ(all, "abxy");
  EXPECT_FALSE(ts.stopped());
  EXPECT_EQ(pieces.back(), "xy");  // could have begun "xyz" until the stream ended
}

TEST(ServerTextStream, InvalidBytesBecomeReplacementCharacters) {
  TextStream ts(byte_tokenizer(), {});
  std::string all;
  stream_pieces(ts, "a\xe2\x9c" "b\xc3", &all);  // a truncated ✓, then a dangling lead byte
  EXPECT_EQ(all, "a\xef\xbf\xbd" "b\xef\xbf\xbd");
  // The end-of-text token is special: not part of the text.
  TextStream eos(byte_tokenizer(), {});
  int32_t ids[] = {'h', 'i', 254};
  EXPECT_EQ(eos.push(ids, 3) + eos.finish(), "hi");
}

TEST(ServerPrompt, BudgetsAgainstTheContext) {
  PromptLimits limits{256, 32, 0, nullptr};
  auto r = parse_completion_request(Endpoint::Completions, R"({"model":"m","prompt":"0123456789"})");
  auto p = prepare_prompt(r, byte_tokenizer(), limits);
  EXPECT_EQ(p.ids.size(), 10u);
  EXPECT_EQ(p.max_tokens, 16);  // the completions default
  r.max_tokens = 22;
  EXPECT_EQ(prepare_prompt(r, byte_tokenizer(), limits).max_tokens, 22);
  r.max_tokens = 23;
  try {
    prepare_prompt(r, byte_tokenizer(), limits);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code, "context_length_exceeded");
    EXPECT_EQ(e.param, "max_tokens");
  }
  auto chat = parse_completion_request(Endpoint::ChatCompletions, R"({"model":"m","messages":[{"role":"user","content":"hi"}]})");
  auto c = prepare_prompt(chat, byte_tokenizer(), limits);
  EXPECT_EQ(std::string(c.ids.begin(), c.ids.end()), "user: hi\nassistant:");
  EXPECT_EQ(c.max_tokens, 32 - int(c.ids.size()));  // chat default: the rest of the context
}

// A tokenizer made for a larger vocabulary than the model's: the text's ids are refused up
// front, naming the parameter, instead of reaching the engine.
TEST(ServerPrompt, TextWhoseIdsTheModelLacksIsRefused) {
  PromptLimits limits{100, 256, 0, nullptr};  // the byte tokenizer gives 'z' = 122
  for (auto [endpoint, body, param] :
       {std::tuple{Endpoint::Completions, R"({"model":"m","prompt":"az"})", "prompt"},
        std::tuple{Endpoint::ChatCompletions, R"({"model":"m","messages":[{"role":"user","content":"z"}]})",
                   "messages"}}) {
    auto r = parse_completion_request(endpoint, body);
    try {
      prepare_prompt(r, byte_tokenizer(), limits);
      FAIL() << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.code, "invalid_token_id");
      EXPECT_EQ(e.param, param);
      EXPECT_NE(std::string(e.what()).find("token id 1"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("do not match"), std::string::npos) << e.what();
    }
  }
}

TEST(ServerQueue, FifoWithBoundedDepthAndShutdownRefusal) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::vector<int> order;
  RequestQueue q(2, [&](Job& j) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release; });
    order.push_back(j.max_tokens);
  });
  auto job = [](int tag) {
    auto j = std::make_shared<Job>();
    j->max_tokens = tag;
    return j;
  };
  auto first = job(1);
  ASSERT_EQ(q.submit(first), RequestQueue::Admission::Accepted);
  while (q.gauges().running == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto a = job(2), b = job(3), c = job(4);
  EXPECT_EQ(q.submit(a), RequestQueue::Admission::Accepted);
  EXPECT_EQ(q.submit(b), RequestQueue::Admission::Accepted);
  EXPECT_EQ(q.submit(c), RequestQueue::Admission::Full);
  EXPECT_EQ(q.gauges().waiting, 2u);
  EXPECT_TRUE(q.withdraw(b));
  EXPECT_FALSE(q.withdraw(b));
  auto d = job(5);
  EXPECT_EQ(q.submit(d), RequestQueue::Admission::Accepted);
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  while (q.gauges().running || q.gauges().waiting) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(order, (std::vector<int>{1, 2, 5}));

  // Shutdown refuses what waits and admits nothing more.
  {
    std::lock_guard lock(mu);
    release = false;
  }
  auto busy = job(6), waiting = job(7);
  q.submit(busy);
  while (q.gauges().running == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  q.submit(waiting);
  q.shutdown();
  EXPECT_EQ(waiting->state, Job::State::Refused);
  EXPECT_EQ(waiting->error->status, 503);
  EXPECT_EQ(q.submit(job(8)), RequestQueue::Admission::ShuttingDown);
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  q.join();
  EXPECT_EQ(order.back(), 6);
}

}  // namespace
}  // namespace dflash::server
