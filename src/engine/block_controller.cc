#include "engine/block_controller.h"

#include <algorithm>
#include <cstdio>

namespace dflash {

BlockController::BlockController(int max_block, bool adaptive, SpeculationHistory* history)
    : max_block_(max_block), block_(max_block), adaptive_(adaptive), reached_(max_block, 0), accepted_(max_block, 0),
      history_(adaptive ? history : nullptr) {
  if (!history_) return;
  if (history_->reached.size() < size_t(max_block)) {
    history_->reached.resize(max_block, 0);
    history_->accepted.resize(max_block, 0);
  }
  ++history_->requests;
  if (!history_->costs_known) return;
  plain_seconds_ = history_->plain_seconds;
  probes_done_ = kProbeSteps;
  const bool explore = history_->requests % kExploreEvery == 0;
  choose_block(history_->draft_seconds, history_->per_row_seconds, "from earlier requests");
  if (off_ && explore) {
    off_ = false;
    events_.push_back("speculation re-tried (one request in " + std::to_string(kExploreEvery) + ")");
  }
}

BlockController::~BlockController() {
  if (!history_) return;
  for (int i = 1; i < max_block_; ++i) {
    history_->reached[i] += reached_[i];
    history_->accepted[i] += accepted_[i];
  }
  if (plain_seconds_ > 0)
    history_->plain_seconds =
        history_->plain_seconds > 0 ? std::min(history_->plain_seconds, plain_seconds_) : plain_seconds_;
  if (fitted_per_row_ >= 0) {
    history_->draft_seconds = fitted_draft_;
    history_->per_row_seconds = fitted_per_row_;
    history_->costs_known = history_->plain_seconds > 0;
  }
}

int BlockController::next() const {
  if (off_) return 1;
  if (adaptive_ && probes_done_ < kProbeSteps) return 1;
  return block_;
}

void BlockController::record(int block, int committed_tokens, double seconds, double draft_seconds) {
  if (block == 1) {
    if (probes_done_++ > 0 || off_) plain_seconds_ = plain_seconds_ == 0 ? seconds : std::min(plain_seconds_, seconds);
    return;
  }
  // Row i was tried when rows 1 … i−1 were accepted, and accepted when i < committed_tokens.
  for (int i = 1; i < block && i <= committed_tokens; ++i) {
    ++reached_[i];
    if (i < committed_tokens) ++accepted_[i];
  }
  if (!adaptive_ || plain_seconds_ <= 0) return;
  if (!cold_step_seen_) {
    cold_step_seen_ = true;
    return;
  }
  ++window_steps_;
  window_seconds_ += seconds;
  window_draft_seconds_ += draft_seconds;
  if (window_steps_ < kWindowSteps) return;
  decide(window_seconds_ / window_steps_, window_draft_seconds_ / window_steps_);
  window_steps_ = 0;
  window_seconds_ = window_draft_seconds_ = 0;
}

double BlockController::expected_tokens(int b) const {
  double expected = 1.0, survive = 1.0, last_rate = 0.0;
  for (int i = 1; i < b; ++i) {
    // Rows never tried yet are assumed as good as the last one that was.
    double acc = double(accepted_[i]), tried = double(reached_[i]);
    if (history_ && history_->reached[i] > 0) {  // the prior counts as a few observations
      acc += kPriorWeight * double(history_->accepted[i]) / double(history_->reached[i]);
      tried += kPriorWeight;
    }
    const double rate = tried > 0 ? acc / tried : last_rate;
    last_rate = rate;
    survive *= rate;
    expected += survive;
  }
  return expected;
}

void BlockController::decide(double step, double draft) {
  // Verifying b rows ≈ one plain step + (b − 1) × per-row cost, fitted to this window. Below
  // 4 rows the difference divided by b − 1 is mostly noise (one row on a GPU costs next to
  // nothing), so a fit from a longer block is kept.
  fitted_draft_ = draft;
  if (block_ >= 4 || fitted_per_row_ < 0)
    fitted_per_row_ = std::max(0.0, (step - draft - plain_seconds_) / (block_ - 1));
  char why[128];
  std::snprintf(why, sizeof why, "block %d: %.2f ms/step (%.2f drafting), plain %.2f ms/token", block_, 1e3 * step,
                1e3 * draft, 1e3 * plain_seconds_);
  choose_block(fitted_draft_, fitted_per_row_, why);
}

void BlockController::choose_block(double draft, double per_row, const char* why) {
  int best = block_;
  double best_rate = 0;
  for (int b = 2; b <= max_block_; ++b) {
    const double rate = expected_tokens(b) / (draft + plain_seconds_ + per_row * (b - 1));
    if (rate > best_rate) {
      best_rate = rate;
      best = b;
    }
  }
  const double plain_rate = 1.0 / plain_seconds_;
  char buf[384];
  if (best_rate < kTolerance * plain_rate) {
    off_ = true;
    std::snprintf(buf, sizeof buf,
                  "%s; best model %.1f tokens/s at block %d < plain %.1f tokens/s: speculation switched off for "
                  "this request",
                  why, best_rate, best, plain_rate);
    events_.push_back(buf);
  } else if (best != block_) {
    std::snprintf(buf, sizeof buf, "%s; block %d -> %d: model %.1f tokens/s (plain %.1f)", why, block_, best,
                  best_rate, plain_rate);
    events_.push_back(buf);
    block_ = best;
  }
}

}  // namespace dflash
