// The verification recording rule's decisions from synthetic launches: the device seconds each
// recording waited for the host after the draft, and the seconds it ran.
#include "engine/recording_rule.h"

#include <gtest/gtest.h>

using namespace dflash;

namespace {

constexpr double kRun = 5e-3;  // a verification's device seconds

// Steps step … step + n − 1: each one that the rule records is launched at `rows` rows and
// measured as having waited `waited` seconds. Returns how many it recorded.
int run(RecordingRule& r, int64_t& step, int n, double waited, int rows = 16) {
  int recorded = 0;
  for (int i = 0; i < n; ++i, ++step) {
    if (!r.record(step)) continue;
    r.launched(rows);
    r.measured(waited, kRun);
    ++recorded;
  }
  return recorded;
}

const double kShortWait = kRun * RecordingRule::kWaitShare / 2;
const double kLongWait = kRun * RecordingRule::kWaitShare * 3;

}  // namespace

TEST(RecordingRule, KeepsRecordingWhileTheHostIsAhead) {
  RecordingRule r;
  int64_t step = 0;
  EXPECT_EQ(run(r, step, 100, 0.0), 100);
  EXPECT_EQ(r.recorded(), 100);
}

// A host a little behind every draft: waits within kWaitShare of the run keep recording. (The
// rule before this one never had a reference here and stopped after two launches.)
TEST(RecordingRule, ShortWaitsKeepRecording) {
  RecordingRule r;
  int64_t step = 0;
  EXPECT_EQ(run(r, step, 100, kShortWait), 100);
}

// Long waits, two in a row, stop recording; then only every kRetryEvery-th step records, and
// one that waits for next to nothing resumes recording.
TEST(RecordingRule, LongWaitsStopRecordingUntilARetryIsOnTime) {
  RecordingRule r;
  int64_t step = 0;
  ASSERT_EQ(run(r, step, 3, 0.0), 3);
  EXPECT_EQ(run(r, step, 2, kLongWait), 2);
  EXPECT_FALSE(r.record(step));  // step 5
  // Steps 5 … 63 record only at 32, which waits too.
  EXPECT_EQ(run(r, step, 59, kLongWait), 1);
  ASSERT_EQ(step, 64);
  EXPECT_TRUE(r.record(step));
  EXPECT_EQ(run(r, step, 1, kShortWait), 1);
  EXPECT_EQ(run(r, step, 10, 0.0), 10);
}

// One long wait between short ones does not stop recording.
TEST(RecordingRule, OneLongWaitAloneKeepsRecording) {
  RecordingRule r;
  int64_t step = 1;
  ASSERT_EQ(run(r, step, 3, 0.0), 3);
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(run(r, step, 1, kLongWait), 1);
    ASSERT_EQ(run(r, step, 1, 0.0), 1);
  }
}

// A small model, whose draft the host never outruns: after the two unjudged recordings, two
// late ones stop recording.
TEST(RecordingRule, AHostAlwaysLateStopsRecording) {
  RecordingRule r;
  int64_t step = 1;  // step 0 would be a retry step
  EXPECT_EQ(run(r, step, 30, kLongWait), 4);
  EXPECT_FALSE(r.record(step));
}

// The first two launches of each row count instantiate its executables and are not judged,
// however long they waited; the third and fourth are.
TEST(RecordingRule, EachRowCountsFirstTwoLaunchesAreNotJudged) {
  RecordingRule r;
  int64_t step = 1;
  ASSERT_EQ(run(r, step, 5, 0.0, 16), 5);
  ASSERT_EQ(run(r, step, 2, kLongWait, 4), 2);
  EXPECT_TRUE(r.record(step));
  ASSERT_EQ(run(r, step, 2, kLongWait, 4), 2);
  EXPECT_FALSE(r.record(step));
}
