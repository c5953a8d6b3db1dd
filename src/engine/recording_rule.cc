#include "engine/recording_rule.h"

namespace dflash {

bool RecordingRule::record(int64_t step) const {
  return late_in_a_row_ < 2 || step % kRetryEvery == 0;
}

void RecordingRule::launched(int rows) {
  ++launches_[rows];
  rows_ = rows;
}

void RecordingRule::measured(double waited_seconds, double run_seconds) {
  if (launches_[rows_] <= 2) return;  // instantiating: not judged
  const bool late = waited_seconds > kWaitShare * run_seconds;
  late_in_a_row_ = late ? late_in_a_row_ + 1 : 0;
}

int64_t RecordingRule::recorded() const {
  int64_t n = 0;
  for (const auto& [rows, launches] : launches_) n += launches;
  return n;
}

}  // namespace dflash
