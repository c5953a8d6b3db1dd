// The verification recording rule's decisions from synthetic launches and device spans.
#include "engine/recording_rule.h"

#include <gtest/gtest.h>

using namespace dflash;

namespace {

// Steps step0 … step0 + n − 1: each one that the rule records is launched with the given
// draft state and measured at `span`. Returns how many it recorded.
int run(RecordingRule& r, int64_t& step, int n, bool draft_running, double span) {
  int recorded = 0;
  for (int i = 0; i < n; ++i, ++step) {
    if (!r.record(step)) continue;
    r.launched(16, draft_running);
    r.measured(span);
    ++recorded;
  }
  return recorded;
}

}  // namespace

TEST(RecordingRule, KeepsRecordingWhileTheDeviceIsStillOnTheDraft) {
  RecordingRule r;
  int64_t step = 0;
  EXPECT_EQ(run(r, step, 100, true, 5e-3), 100);
}

// A launch that found the draft done but whose span is within kWaitShare of the reference
// waited for next to nothing: recording goes on (the old rule stopped here).
TEST(RecordingRule, ShortWaitsAfterTheDraftKeepRecording) {
  RecordingRule r;
  int64_t step = 0;
  ASSERT_EQ(run(r, step, 5, true, 5e-3), 5);
  EXPECT_EQ(run(r, step, 95, false, 5e-3 * (1 + RecordingRule::kWaitShare / 2)), 95);
  EXPECT_EQ(r.recorded(), 100);
}

// Waits longer than kWaitShare of the reference, two in a row, stop recording; then only
// every kRetryEvery-th step records, and one that waits for nothing resumes recording.
TEST(RecordingRule, LongWaitsStopRecordingUntilARetryFindsTheDeviceBusy) {
  RecordingRule r;
  int64_t step = 0;
  ASSERT_EQ(run(r, step, 3, true, 5e-3), 3);
  const double long_wait = 5e-3 * (1 + 3 * RecordingRule::kWaitShare);
  EXPECT_EQ(run(r, step, 2, false, long_wait), 2);
  EXPECT_FALSE(r.record(step));  // step 5
  // Steps 5 … 63 record only at 32.
  EXPECT_EQ(run(r, step, 59, false, long_wait), 1);
  ASSERT_EQ(step, 64);
  EXPECT_TRUE(r.record(step));
  r.launched(16, true);
  r.measured(5e-3);
  ++step;
  EXPECT_TRUE(r.record(step));
  EXPECT_EQ(run(r, step, 10, true, 5e-3), 10);
}

// One long wait between short ones does not stop recording.
TEST(RecordingRule, OneLongWaitAloneKeepsRecording) {
  RecordingRule r;
  int64_t step = 0;
  ASSERT_EQ(run(r, step, 3, true, 5e-3), 3);
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(run(r, step, 1, false, 8e-3), 1);
    ASSERT_EQ(run(r, step, 1, false, 5e-3), 1);
  }
}

// A small model, whose draft the host never outruns: no launch ever finds the device busy, so
// there is no reference, and after the two unjudged recordings two launches stop recording.
TEST(RecordingRule, WithoutAReferenceLateLaunchesStopRecording) {
  RecordingRule r;
  int64_t step = 1;  // step 0 would be a retry step
  EXPECT_EQ(run(r, step, 30, false, 3e-4), 4);
  EXPECT_FALSE(r.record(step));
}

// The reference is per row count: a block of 4 rows is not judged by the spans of 16.
TEST(RecordingRule, ReferencesArePerRowCount) {
  RecordingRule r;
  for (int64_t step = 1; step < 4; ++step) {
    ASSERT_TRUE(r.record(step));
    r.launched(16, true);
    r.measured(5e-3);
  }
  for (int64_t step = 4; step < 6; ++step) {
    ASSERT_TRUE(r.record(step));
    r.launched(4, false);  // no reference for 4 rows yet
    r.measured(4.5e-3);
  }
  EXPECT_FALSE(r.record(6));
}
