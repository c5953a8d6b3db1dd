#pragma once
// Runs one Job on the Engine (on the queue's worker thread): streams safe text into the job
// as tokens commit, stops at stop strings, and ends early when the client is gone, the
// request's deadline passes or the server aborts.
#include <atomic>
#include <cstdint>
#include <vector>

#include "engine/generation.h"
#include "server/job.h"
#include "server/metrics.h"
#include "tokenizer/tokenizer.h"

namespace dflash::server {

class GenerationRunner {
 public:
  GenerationRunner(Engine& engine, const Tokenizer& tokenizer, std::vector<int32_t> eos_ids, Metrics& metrics,
                   int slowdown_ms = 0)
      : engine_(engine), tokenizer_(tokenizer), eos_ids_(std::move(eos_ids)), metrics_(metrics),
        slowdown_ms_(slowdown_ms) {}

  // Never throws: failures end up in the job as an error.
  void run(Job& job);
  // Makes the running generation (and any later one) stop at its next commit.
  void abort_all() { abort_ = true; }

 private:
  Engine& engine_;
  const Tokenizer& tokenizer_;
  std::vector<int32_t> eos_ids_;
  Metrics& metrics_;
  int slowdown_ms_;  // test hook: widens the window in which requests overlap
  std::atomic<bool> abort_{false};
};

}  // namespace dflash::server
