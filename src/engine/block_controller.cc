#include "engine/block_controller.h"

#include <algorithm>
#include <cstdio>

namespace dflash {

int BlockController::next() const {
  if (off_) return 1;
  if (adaptive_ && probes_done_ < kProbeSteps) return 1;
  return block_;
}

void BlockController::record(int block, int committed_tokens, double seconds, double draft_seconds) {
  if (block == 1) {
    plain_seconds_ = plain_seconds_ == 0 ? seconds : std::min(plain_seconds_, seconds);
    ++probes_done_;
    return;
  }
  if (!adaptive_ || plain_seconds_ <= 0) return;
  ++window_steps_;
  window_tokens_ += committed_tokens;
  window_seconds_ += seconds;
  window_draft_seconds_ += draft_seconds;
  if (window_steps_ < kWindowSteps) return;
  const double spec_rate = window_tokens_ / window_seconds_, plain_rate = 1.0 / plain_seconds_;
  if (spec_rate < kTolerance * plain_rate) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "block %d gave %.2f tokens/step at %.2f ms/step = %.1f tokens/s, plain %.1f tokens/s: ",
                  block_, double(window_tokens_) / window_steps_, 1e3 * window_seconds_ / window_steps_, spec_rate,
                  plain_rate);
    // Any block costs at least its drafting plus one plain step of verification.
    const double tokens_per_step = double(window_tokens_) / window_steps_;
    const double best_case_rate = tokens_per_step / (plain_seconds_ + window_draft_seconds_ / window_steps_);
    if (block_ > 2 && best_case_rate >= kTolerance * plain_rate) {
      block_ = std::max(2, block_ / 2);
      events_.push_back(std::string(buf) + "block shortened to " + std::to_string(block_));
    } else {
      off_ = true;
      events_.push_back(std::string(buf) + "speculation switched off for this request");
    }
  }
  window_steps_ = window_tokens_ = 0;
  window_seconds_ = window_draft_seconds_ = 0;
}

}  // namespace dflash
