#include "engine/recording_rule.h"

namespace dflash {

bool RecordingRule::record(int64_t step) const {
  return recorded_ < 2 || late_in_a_row_ < 2 || step % kRetryEvery == 0;
}

void RecordingRule::launched(int rows, bool draft_running) {
  ++recorded_;
  rows_ = rows;
  draft_running_ = draft_running;
}

void RecordingRule::measured(double span_seconds) {
  if (recorded_ <= 2) return;  // instantiating: not judged
  if (draft_running_) {
    reference_[rows_] = span_seconds;
    late_in_a_row_ = 0;
    return;
  }
  const auto it = reference_.find(rows_);
  // No reference yet: every launch of this row count found the draft done, so every one may
  // have waited; counted as late.
  const bool late = it == reference_.end() || span_seconds - it->second > kWaitShare * it->second;
  late_in_a_row_ = late ? late_in_a_row_ + 1 : 0;
}

}  // namespace dflash
