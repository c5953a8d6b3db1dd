#pragma once
// Whether the speculative loop queues a verification as one recording (a CUDA graph) or op by
// op. A recording runs faster on the device (1.7-2.0 % of a verification at Qwen3-8B shapes on
// an H200, `dflash bench --graph-probe`), but it starts only once the host has recorded it:
// when the device finishes the draft before that, it waits. The wait is what the rule judges.
//
// The wait is measured directly: from the draft's end to a mark queued right before the
// recording (Backend::queue_recorded's `started`), which the device reaches at the later of
// the two. A recording whose wait exceeds kWaitShare of its own run (about what recording
// saves) is late. Recording stops after two late ones in a row; when not recording, every 32nd
// step tries again. The first two recordings of each row count instantiate executables (slow
// on the host) and are not judged.
//
// (Before: a recording was judged by its span from the draft's end against a reference span of
// one that found the device still on the draft. Where the host was a little behind every draft
// there was never a reference, every launch counted as late, and on some hosts 5 of 63
// verifications were recorded where recording all gave a 1-2 % shorter step; H200, Qwen3-8B
// shapes, docs/benchmarks.md, twenty-third and twenty-eighth passes.)
#include <cstdint>
#include <map>

namespace dflash {

class RecordingRule {
 public:
  static constexpr double kWaitShare = 0.02;
  static constexpr int64_t kRetryEvery = 32;

  // Whether step `step` (0, 1, …) should record its verification.
  bool record(int64_t step) const;
  // A recording of `rows` rows was launched.
  void launched(int rows);
  // The recording just launched: the device seconds it waited for the host after the draft,
  // and the device seconds it ran.
  void measured(double waited_seconds, double run_seconds);

  // Recordings launched so far, of every row count.
  int64_t recorded() const;

 private:
  int late_in_a_row_ = 0;
  int rows_ = 0;
  std::map<int, int64_t> launches_;  // by row count
};

}  // namespace dflash
