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

TEST(GenerationStats, DecodeRateLeavesOutTheTokenThePrefillChose) {
  // Two requests of 9 and 5 tokens: the first token of each came with its prefill, so decoding
  // made 8 + 4 tokens in the 2 + 1 seconds after the prefills.
  GenerationStats a, b, all;
  a.generated_tokens = 9, a.first_tokens = 1, a.prefill_seconds = 0.5, a.total_seconds = 2.5;
  b.generated_tokens = 5, b.first_tokens = 1, b.prefill_seconds = 0.25, b.total_seconds = 1.25;
  EXPECT_DOUBLE_EQ(a.decode_tokens_per_second(), 4.0);
  all.merge(a);
  all.merge(b);
  EXPECT_EQ(all.first_tokens, 2);
  EXPECT_DOUBLE_EQ(all.decode_tokens_per_second(), 4.0);
  EXPECT_NE(all.to_text().find("14 generated (12 of them decoded)"), std::string::npos) << all.to_text();
}

}  // namespace
