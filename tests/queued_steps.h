#pragma once
// The check shared by the CPU and CUDA tests of the engine's queued greedy loops.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

#include "engine/generation.h"

namespace dflash::test {

// Greedy decoding without penalties keeps the chosen ids on the backend and queues each step
// before the host reads the step ahead (EngineOptions::queue_ahead); with it off the host reads
// every choice first. The queued side also queues the drafter's context rows of each verified
// block before the read (EngineOptions::context_ahead: all rows, truncated afterwards), the
// host-driven side only the committed rows, after it. Both loops must give the same tokens,
// finish reasons and steps (each step's acceptance among them: a drafter left with another
// context drafts other tokens), through end-of-sequence, max_new_tokens and a context that
// runs out.
inline void expect_queued_equals_host_driven(Qwen3Model& target, DFlashDrafter& drafter, int prompts, uint32_t seed) {
  const int vocab = target.config().vocab_size;
  for (int block : {4, 16}) {
    for (int64_t context : {int64_t(0), int64_t(40)}) {
      EngineOptions queued, host;
      queued.block_size = host.block_size = block;
      queued.adaptive = host.adaptive = false;
      queued.context_length = host.context_length = context;
      host.queue_ahead = false;
      queued.context_ahead = 1;
      host.context_ahead = 0;
      Engine eq(target, &drafter, queued), eh(target, &drafter, host);
      std::mt19937 rng(seed + uint32_t(block) + uint32_t(context));
      for (int i = 0; i < prompts; ++i) {
        GenerationRequest req;
        req.prompt.resize(1 + rng() % 24);
        for (auto& id : req.prompt) id = static_cast<int32_t>(rng() % uint32_t(vocab - 1));
        // The first request runs long: positions pass several doublings of the RoPE table.
        req.max_new_tokens = i == 0 && context == 0 ? 150 : 20 + i % 9;
        if (i % 2) req.eos_ids = {static_cast<int32_t>(rng() % uint32_t(vocab))};
        for (bool spec : {false, true}) {
          const auto a = spec ? eq.generate_speculative(req) : eq.generate_plain(req);
          const auto b = spec ? eh.generate_speculative(req) : eh.generate_plain(req);
          const std::string what = std::string(spec ? "speculative" : "plain") + " block " + std::to_string(block) +
                                   " context " + std::to_string(context) + " prompt " + std::to_string(i);
          ASSERT_EQ(a.tokens, b.tokens) << what;
          ASSERT_EQ(a.finish, b.finish) << what;
          ASSERT_EQ(a.stats.plain_steps, b.stats.plain_steps) << what;
          ASSERT_EQ(a.stats.step_acceptance, b.stats.step_acceptance) << what;
          // The queued loop runs at most one step past the end, and only past a stop it could
          // not foresee: a request cut by max_new_tokens or the context computes no step to drop.
          EXPECT_LE(a.stats.discarded_steps, a.finish == FinishReason::Stop ? 1 : 0) << what;
        }
      }
    }
  }
}

// What EngineOptions::context_ahead rests on: the drafter's context rows of a whole verified
// block, truncated to the n committed ones, leave the drafter as the n rows alone do. The next
// draft's logits must be the same bits, twice over (the second round's rows overwrite the
// first round's truncated ones).
inline void expect_truncated_context_equals_committed_rows(Qwen3Model& target, DFlashDrafter& drafter) {
  Backend& b = target.backend();
  const std::vector<int>& layers = drafter.config().target_layer_ids;
  const int vocab = target.config().vocab_size, B = 4;
  SequenceState t_state = target.new_sequence(64);
  SequenceState ahead = drafter.new_sequence(64), after = drafter.new_sequence(64);
  std::vector<int32_t> prompt = {1, 5, 2, 7, 3};
  for (auto& id : prompt) id %= vocab;
  ForwardOutput f = target.forward(t_state, prompt, false, layers);
  drafter.add_context(ahead, f.features);
  drafter.add_context(after, f.features);
  for (int n : {2, 1}) {
    std::vector<int32_t> block(B);
    for (int i = 0; i < B; ++i) block[size_t(i)] = static_cast<int32_t>((3 * i + n) % vocab);
    const int64_t s = t_state.length();
    ForwardOutput v = target.forward(t_state, block, true, layers);
    drafter.add_context(ahead, v.features);
    ahead.truncate(s + n);
    drafter.add_context(after, v.features.slice_rows(0, n));
    t_state.truncate(s + n);
    ASSERT_EQ(ahead.length(), after.length());
    const Tensor la = drafter.draft(ahead, block[size_t(n)], B), lb = drafter.draft(after, block[size_t(n)], B);
    std::vector<float> xa(size_t(la.rows * la.cols)), xb(size_t(lb.rows * lb.cols));
    b.download(la, xa.data());
    b.download(lb, xb.data());
    ASSERT_EQ(xa, xb) << "the draft after " << n << " committed rows of " << B;
  }
}

}  // namespace dflash::test
