#pragma once
// Whether the speculative loop queues a verification as one recording (a CUDA graph) or op by
// op. A recording runs faster on the device (1.7-2.0 % of a verification at Qwen3-8B shapes on
// an H200, `dflash bench --graph-probe`), but it starts only once the host has recorded it:
// when the device finishes the draft before that, it waits. The wait is what the rule judges.
//
// A recording launched while the device was still on the draft waited for nothing; its span on
// the device (draft end to verification end) is the reference for its row count. A recording
// launched after the draft had ended waited for span − reference. Recording stops after two
// launches in a row that waited longer than kWaitShare of the reference (about what recording
// saves); when not recording, every 32nd step tries again. The first two recordings of a shape
// instantiate executables (slow on the host) and are not judged.
//
// (Before: stopping after two launches in a row that merely found the draft done. That judged a
// wait of microseconds like one of a whole recording, and on some hosts it recorded 5 of 63
// verifications where recording all gave a 2 % shorter step; H200, Qwen3-8B shapes,
// docs/benchmarks.md, twenty-third pass. A rule before that one, the draft's device time
// against the fastest recording's, misjudged both ends: the draft's time includes waiting for
// its own launches. The span here starts where the draft ends.)
#include <cstdint>
#include <map>

namespace dflash {

class RecordingRule {
 public:
  static constexpr double kWaitShare = 0.02;
  static constexpr int64_t kRetryEvery = 32;

  // Whether step `step` (0, 1, …) should record its verification.
  bool record(int64_t step) const;
  // A recording of `rows` rows was launched; draft_running: the device was still on the draft.
  void launched(int rows, bool draft_running);
  // The device seconds from the draft's end to the end of the recording just launched.
  void measured(double span_seconds);

  int64_t recorded() const { return recorded_; }

 private:
  int64_t recorded_ = 0;
  int late_in_a_row_ = 0;
  int rows_ = 0;
  bool draft_running_ = false;
  std::map<int, double> reference_;  // by row count: the span of the last recording that waited for nothing
};

}  // namespace dflash
