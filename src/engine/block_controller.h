#pragma once
// Decides the block size of each speculative step from what the steps actually cost
// (contract section 6). It measures a couple of plain one-token steps first, then compares
// the speculative tokens per second of each window of steps against them: a block that does
// not pay is halved, and speculation is switched off for the request at block 2, or at once
// when even a free verification could not pay for the tokens the window yielded.
#include <string>
#include <vector>

namespace dflash {

class BlockController {
 public:
  BlockController(int max_block, bool adaptive) : block_(max_block), adaptive_(adaptive) {}

  int next() const;  // rows of the next step; 1 means a plain step
  bool drafting_over() const { return off_; }
  int block() const { return block_; }
  // One step: `seconds` in all, `draft_seconds` of it drafting (0 for plain steps).
  void record(int block, int committed_tokens, double seconds, double draft_seconds = 0);
  std::vector<std::string> take_events() { return std::move(events_); }

  static constexpr int kProbeSteps = 2;
  static constexpr int kWindowSteps = 4;
  static constexpr double kTolerance = 0.95;  // speculation must keep 95% of plain speed

 private:
  int block_;
  bool adaptive_;
  bool off_ = false;
  int probes_done_ = 0;
  double plain_seconds_ = 0;  // best observed one-token step
  int window_steps_ = 0, window_tokens_ = 0;
  double window_seconds_ = 0, window_draft_seconds_ = 0;
  std::vector<std::string> events_;
};

}  // namespace dflash
