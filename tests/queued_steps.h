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
// every choice first. Both loops must give the same tokens, finish reasons and steps, through
// end-of-sequence, max_new_tokens and a context that runs out.
inline void expect_queued_equals_host_driven(Qwen3Model& target, DFlashDrafter& drafter, int prompts, uint32_t seed) {
  const int vocab = target.config().vocab_size;
  for (int block : {4, 16}) {
    for (int64_t context : {int64_t(0), int64_t(40)}) {
      EngineOptions queued, host;
      queued.block_size = host.block_size = block;
      queued.adaptive = host.adaptive = false;
      queued.context_length = host.context_length = context;
      host.queue_ahead = false;
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

}  // namespace dflash::test
