#include "engine/block_controller.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace dflash {

BlockController::BlockController(int max_block, bool adaptive, SpeculationHistory* history)
    : max_block_(max_block), block_(max_block), adaptive_(adaptive), reached_(max_block, 0), accepted_(max_block, 0),
      step_seconds_(max_block + 1, 0.0), step_count_(max_block + 1, 0), size_warm_(max_block + 1, 0),
      history_(adaptive ? history : nullptr) {
  if (!history_) return;
  if (history_->reached.size() < size_t(max_block)) {
    history_->reached.resize(max_block, 0);
    history_->accepted.resize(max_block, 0);
  }
  if (history_->step_count.size() < size_t(max_block + 1)) {
    history_->step_seconds.resize(max_block + 1, 0.0);
    history_->step_count.resize(max_block + 1, 0);
  }
  ++history_->requests;
  if (!history_->costs_known) return;
  plain_seconds_ = history_->plain_seconds;
  probes_done_ = kProbeSteps;
  const bool explore = history_->requests % kExploreEvery == 0;
  choose_block("from earlier requests");
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
  history_->draft_seconds += draft_seconds_;
  history_->draft_steps += draft_steps_;
  bool timed = false;
  for (int b = 2; b <= max_block_; ++b) {
    history_->step_seconds[b] += step_seconds_[b];
    history_->step_count[b] += step_count_[b];
    timed = timed || history_->step_count[b] > 0;
  }
  history_->costs_known = history_->plain_seconds > 0 && timed;
}

int BlockController::next() const {
  if (off_) return 1;
  if (adaptive_ && probes_done_ < kProbeSteps) return 1;
  return explore_block_ > 0 ? explore_block_ : block_;
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
  if (block > max_block_) return;
  if (!size_warm_[block]) {  // see kProbeSteps
    size_warm_[block] = 1;
    return;
  }
  draft_seconds_ += draft_seconds;
  ++draft_steps_;
  step_seconds_[block] += seconds;
  ++step_count_[block];
  ++window_steps_;
  window_seconds_ += seconds;
  window_draft_seconds_ += draft_seconds;
  if (window_steps_ < kWindowSteps) return;
  explore_block_ = 0;
  decide(block, window_seconds_ / window_steps_, window_draft_seconds_ / window_steps_);
  window_steps_ = 0;
  window_seconds_ = window_draft_seconds_ = 0;
  const long tried_past = block_ < max_block_ ? reached_[block_] + (history_ ? history_->reached[block_] : 0) : 0;
  if (!off_ && block_ < max_block_ && tried_past < kExploreSamples && ++windows_since_explore_ >= kExploreWindows) {
    windows_since_explore_ = 0;
    explore_block_ = std::min(max_block_, 2 * block_);
    events_.push_back("one window at block " + std::to_string(explore_block_) + " (block " + std::to_string(block_) +
                      " chosen): rates and costs of the longer block measured again");
  }
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

double BlockController::step_seconds(int b) const {
  const bool hist = history_ != nullptr;
  auto timed = [&](int k, double& mean) {
    const long n = step_count_[k] + (hist ? history_->step_count[k] : 0);
    if (n == 0) return false;
    mean = (step_seconds_[k] + (hist ? history_->step_seconds[k] : 0.0)) / double(n);
    return true;
  };
  const long drafts = draft_steps_ + (hist ? history_->draft_steps : 0);
  const double draft = drafts > 0 ? (draft_seconds_ + (hist ? history_->draft_seconds : 0.0)) / double(drafts) : 0.0;
  const double anchor = draft + plain_seconds_;  // b = 1 stands for drafting + a plain step
  double lo_t = anchor, hi_t = 0, t = 0;
  int lo = 1, hi = 0;
  for (int k = 2; k <= max_block_; ++k) {
    if (!timed(k, t)) continue;
    if (k == b) return t;
    if (k < b) lo = k, lo_t = t;
    else if (hi == 0) hi = k, hi_t = t;
  }
  if (hi > 0) return lo_t + (hi_t - lo_t) * double(b - lo) / double(hi - lo);
  if (lo == 1) return anchor;  // nothing timed: no per-row cost known
  return anchor + std::max(0.0, lo_t - anchor) * double(b - 1) / double(lo - 1);
}

void BlockController::decide(int block, double step, double draft) {
  char why[128];
  std::snprintf(why, sizeof why, "block %d: %.2f ms/step (%.2f drafting), plain %.2f ms/token", block, 1e3 * step,
                1e3 * draft, 1e3 * plain_seconds_);
  choose_block(why);
}

void BlockController::choose_block(const char* why) {
  int best = block_;
  double best_rate = 0;
  for (int b = 2; b <= max_block_; ++b) {
    const double rate = expected_tokens(b) / step_seconds(b);
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
