// The statistics a request reports (contract section 5), with the block sizes the controller
// chose: a block shortened for good shows as steps at that size, not only as a lower τ.
#include "engine/stats.h"

#include <string>

#include "test_util.h"

using namespace dflash;

namespace {

TEST(GenerationStats, CountsStepsByRowsVerifiedAndMergesThem) {
  GenerationStats a;
  a.record_step(16, 3);
  a.record_step(4, 4);
  a.record_step(4, 1);
  GenerationStats b;
  b.record_step(8, 8);
  GenerationStats all;
  all.merge(a);
  all.merge(b);
  ASSERT_EQ(all.steps_by_rows.size(), 16u);
  EXPECT_EQ(all.steps_by_rows[3], 2);
  EXPECT_EQ(all.steps_by_rows[7], 1);
  EXPECT_EQ(all.steps_by_rows[15], 1);
  EXPECT_EQ(all.steps, 4);
  EXPECT_DOUBLE_EQ(all.mean_acceptance_length(), (3 + 4 + 1 + 8) / 4.0);
  const std::string text = all.to_text();
  EXPECT_NE(text.find("steps by rows verified: 4:2 8:1 16:1\n"), std::string::npos) << text;
  EXPECT_EQ(all.to_json()["steps_by_rows"][3], 2);
}

}  // namespace
