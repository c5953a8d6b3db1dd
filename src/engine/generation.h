#pragma once
// Requests, results and the two decoding loops: plain (one token a step) and DFlash
// speculative (draft a block, verify it in one target pass, keep the longest correct prefix).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/block_controller.h"
#include "engine/sampling.h"
#include "engine/stats.h"
#include "model/dflash_drafter.h"
#include "model/qwen3.h"

namespace dflash {

enum class FinishReason { Stop, Length, Cancelled };
const char* finish_reason_name(FinishReason r);

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> eos_ids;  // the request ends right after any of these
  // After each commit, with the whole output so far: true ends the request (stop strings).
  std::function<bool(const std::vector<int32_t>& output)> stop_check;
  // Streaming: the tokens just committed.
  std::function<void(const int32_t* tokens, size_t n)> on_tokens;
  std::function<bool()> cancelled;
};

struct GenerationResult {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::Length;
  GenerationStats stats;
};

struct EngineOptions {
  int64_t context_length = 0;  // 0: the target's max_position_embeddings
  // Most rows one step verifies; 0: the drafter's block_size. The drafter always drafts at
  // least the block it was trained on (a shorter block collapses its acceptance).
  int block_size = 0;
  bool adaptive = true;        // shorten the block / stop drafting when speculation does not pay
  const class AcceptanceRule* acceptance = nullptr;  // null: the exact rule of the contract
  // Benchmarks only: every step commits exactly this many tokens (anchor + drafts) whatever
  // the target says, to time steps at a chosen acceptance length with random weights. The
  // output is NOT the target's; 0 = off.
  int forced_acceptance = 0;
  // Greedy decoding without penalties queues each step before the host has read the step
  // ahead of it: the chosen ids stay on the device between passes, and a backend that records
  // steps (CUDA graphs) launches each as one unit. false: the host reads every step's choice
  // before queuing the next (what other sampling does; the same tokens). DFLASH_QUEUE_AHEAD=0
  // sets it false (measuring).
  bool queue_ahead = true;
  // When the drafter's context rows for a verified block are queued. 1: right behind the
  // verification, every row of the block (the rejected rows are then truncated away, as the
  // target's are), so that the update runs while the host waits for the block's result and
  // decides; 0: after the decision, the committed rows only, so that no row is projected in
  // vain. -1 (default): 1 where the backend runs ahead of the host (Backend::runs_ahead), 0
  // where each op has run when its call returns. The same context rows, the same tokens.
  // DFLASH_CONTEXT_AHEAD=0 or 1 sets it (measuring).
  int context_ahead = -1;
};

class Engine {
 public:
  Engine(Qwen3Model& target, DFlashDrafter* drafter, EngineOptions options = {});

  // Speculative when a drafter is loaded, plain otherwise.
  GenerationResult generate(const GenerationRequest& request);
  GenerationResult generate_plain(const GenerationRequest& request);
  GenerationResult generate_speculative(const GenerationRequest& request);

  Qwen3Model& target() { return target_; }
  DFlashDrafter* drafter() { return drafter_; }
  int64_t context_length() const { return context_length_; }
  int block_size() const { return block_size_; }
  int draft_block_size() const { return draft_block_; }
  const SpeculationHistory& speculation_history() const { return history_; }
  // Back to what a fresh engine knows (dflash bench, after its untimed warm-up requests).
  void forget_history() { history_ = {}; }

 private:
  void check_request(const GenerationRequest& r) const;
  GenerationResult generate_plain_queued(const GenerationRequest& request);
  Qwen3Model& target_;
  DFlashDrafter* drafter_;
  EngineOptions options_;
  int64_t context_length_;
  int block_size_;   // most rows verified per step
  int draft_block_;  // rows the drafter drafts per step: max(trained block, block_size_)
  SpeculationHistory history_;  // what earlier requests measured (block choice)
};

}  // namespace dflash
