#include "engine/generation.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "engine/logit_rows.h"
#include "engine/output_sink.h"
#include "util/error.h"

namespace dflash {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "?";
}

Engine::Engine(Qwen3Model& target, DFlashDrafter* drafter, EngineOptions options)
    : target_(target), drafter_(drafter), options_(options) {
  context_length_ = options.context_length > 0 ? options.context_length : target.config().max_position_embeddings;
  block_size_ = options.block_size > 0 ? options.block_size : (drafter ? drafter->config().block_size : 1);
  if (drafter && (block_size_ < 2 || block_size_ > 32))
    throw Error("--block-size must be between 2 and 32, got " + std::to_string(block_size_));
  draft_block_ = drafter ? std::max(block_size_, drafter->config().block_size) : 1;
  if (const char* e = std::getenv("DFLASH_QUEUE_AHEAD"); e && std::string(e) == "0") options_.queue_ahead = false;
  if (const char* e = std::getenv("DFLASH_CONTEXT_AHEAD"); e && (std::string(e) == "0" || std::string(e) == "1"))
    options_.context_ahead = std::atoi(e);
}

void Engine::check_request(const GenerationRequest& r) const {
  validate(r.sampling);
  if (r.prompt.empty()) throw Error("the prompt is empty: at least one token is needed");
  if (r.max_new_tokens < 1) throw Error("max_new_tokens must be at least 1, got " + std::to_string(r.max_new_tokens));
  if (static_cast<int64_t>(r.prompt.size()) > context_length_)
    throw Error("the prompt has " + std::to_string(r.prompt.size()) + " tokens, longer than the context of " +
                std::to_string(context_length_));
  const int vocab = target_.config().vocab_size;
  for (int32_t t : r.prompt)
    if (t < 0 || t >= vocab)
      throw Error("prompt token id " + std::to_string(t) + " is outside the vocabulary (0 … " + std::to_string(vocab - 1) + ")");
  for (const auto& [t, bias] : r.sampling.logit_bias)
    if (t >= vocab)
      throw Error("logit_bias: token id " + std::to_string(t) + " is outside the vocabulary (0 … " +
                  std::to_string(vocab - 1) + ")");
}

GenerationResult Engine::generate(const GenerationRequest& r) {
  return drafter_ ? generate_speculative(r) : generate_plain(r);
}

GenerationResult Engine::generate_plain(const GenerationRequest& r) {
  check_request(r);
  if (options_.queue_ahead && r.sampling.argmax_only()) return generate_plain_queued(r);
  GenerationResult result;
  OutputSink out(r, result);
  GenerationStats& st = result.stats;
  st.prompt_tokens = static_cast<int64_t>(r.prompt.size());
  const int vocab = target_.config().vocab_size;
  const int64_t capacity = std::min<int64_t>(context_length_, int64_t(r.prompt.size()) + r.max_new_tokens);
  Rng rng(r.sampling.seed);
  LogitRows rows(target_.backend(), r.sampling, vocab);

  Stopwatch total;
  SequenceState state = target_.new_sequence(capacity);
  auto next_token = [&](const Tensor& last_logits) {
    rows.read(last_logits, {&r.prompt, &out.tokens()});
    return rows.choose(0, rng);
  };
  ForwardOutput fwd = target_.forward(state, r.prompt, false);
  int32_t token = next_token(fwd.logits);
  st.prefill_seconds = total.seconds();
  out.commit(token);
  while (!out.done()) {
    if (state.length() >= capacity) {
      out.context_exhausted();
      break;
    }
    Stopwatch step;
    fwd = target_.forward(state, {token}, false);
    token = next_token(fwd.logits);
    ++st.plain_steps;
    st.plain_seconds += step.seconds();
    out.commit(token);
  }
  st.finish_request(static_cast<int64_t>(result.tokens.size()), total.seconds());
  return result;
}

// Greedy plain decoding one step ahead of the host: step n + 1 embeds the id step n's argmax
// left on the device, so it is queued before the host reads step n's token. When the request
// ends, the step queued past its end is drained and dropped (its row is past what the output
// holds; the state goes with the request).
GenerationResult Engine::generate_plain_queued(const GenerationRequest& r) {
  GenerationResult result;
  OutputSink out(r, result);
  GenerationStats& st = result.stats;
  st.prompt_tokens = static_cast<int64_t>(r.prompt.size());
  const int64_t capacity = std::min<int64_t>(context_length_, int64_t(r.prompt.size()) + r.max_new_tokens);
  Backend& b = target_.backend();

  Stopwatch total;
  SequenceState state = target_.new_sequence(capacity);
  Tensor next = b.alloc(1, 1, DType::I32);  // the id the next step embeds
  target_.forward(state, r.prompt, false, {}, &next);
  int32_t token = b.read_ids(next)->get()[0];
  st.prefill_seconds = total.seconds();
  out.commit(token);
  // The prefill gave the first token, so max_new_tokens − 1 steps can be used: a step past
  // them would be computed only to be dropped (one forward pass a request, 1.6 % of a 64-token
  // request's decoding).
  const int64_t usable_steps = int64_t(r.max_new_tokens) - 1;
  int64_t queued = 0;
  auto queue_step = [&] {
    b.queue_recorded("decode", [&] { target_.forward(state, next, false, {}, &next); }, nullptr);
    ++queued;
    return b.read_ids(next);
  };
  std::unique_ptr<PendingIds> current, ahead;
  while (!out.done()) {
    Stopwatch step;
    if (!current) {
      if (state.length() >= capacity) {
        out.context_exhausted();
        break;
      }
      current = queue_step();
    }
    if (state.length() < capacity && queued < usable_steps) ahead = queue_step();
    token = current->get()[0];
    ++st.plain_steps;
    st.plain_seconds += step.seconds();
    out.commit(token);
    current = std::move(ahead);
  }
  if (current) {  // a step queued past the end (a stop the host could not foresee): drained, dropped
    current->get();
    ++st.discarded_steps;
  }
  st.finish_request(static_cast<int64_t>(result.tokens.size()), total.seconds());
  return result;
}

}  // namespace dflash
