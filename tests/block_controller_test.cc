// The block controller's decisions from synthetic step timings (contract section 6).
#include "engine/block_controller.h"

#include <algorithm>
#include <string>
#include <vector>

#include "test_util.h"

using namespace dflash;

namespace {

// Plain steps of 1 ms; a speculative step costs `draft` + 1 ms + `per_row` per extra row and
// commits `tokens`.
void run_window(BlockController& c, int tokens, double draft, double per_row) {
  for (int i = 0; i < BlockController::kWindowSteps; ++i) {
    const int b = c.next();
    if (b == 1) {
      c.record(1, 1, 1e-3);
      continue;
    }
    c.record(b, std::min(tokens, b), draft + 1e-3 + per_row * (b - 1), draft);
  }
}

void probe(BlockController& c) {
  for (int i = 0; i < BlockController::kProbeSteps; ++i) {
    ASSERT_EQ(c.next(), 1);
    c.record(1, 1, i == 0 ? 5e-3 : 1e-3);  // the cold first step is not the measure
  }
  // Nor is the first speculative step: here 50 plain steps' worth.
  const int b = c.next();
  if (b > 1) c.record(b, 1, 50e-3, 1e-3);
}

TEST(BlockController, KeepsAFullBlockThatPays) {
  BlockController c(16, true);
  probe(c);
  ASSERT_EQ(c.next(), 16);
  run_window(c, 16, 0.2e-3, 0.02e-3);  // GPU-like: 16 rows cost barely more than one
  run_window(c, 16, 0.2e-3, 0.02e-3);
  EXPECT_EQ(c.next(), 16);
  EXPECT_FALSE(c.drafting_over());
}

TEST(BlockController, SwitchesOffWhenVerificationCostsTooMuch) {
  BlockController c(16, true);
  probe(c);
  run_window(c, 3, 2e-3, 0.4e-3);  // CPU-like: every row costs 40% of a plain step
  EXPECT_TRUE(c.drafting_over());
  EXPECT_EQ(c.next(), 1);
  const auto events = c.take_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_NE(events[0].find("speculation switched off"), std::string::npos) << events[0];
}

TEST(BlockController, ShortensTheBlockWhenLateRowsAreRarelyAccepted) {
  BlockController c(16, true);
  probe(c);
  for (int w = 0; w < 3; ++w) run_window(c, 3, 0.3e-3, 0.1e-3);  // always 3 tokens: rows ≥ 3 wasted
  EXPECT_FALSE(c.drafting_over());
  EXPECT_LT(c.next(), 16);
  EXPECT_GE(c.next(), 3);
}

TEST(BlockController, LaterRequestsStartFromWhatEarlierOnesMeasured) {
  SpeculationHistory history;
  {
    BlockController first(16, true, &history);
    probe(first);
    run_window(first, 3, 2e-3, 0.4e-3);
    EXPECT_TRUE(first.drafting_over());
  }
  ASSERT_TRUE(history.costs_known);
  BlockController second(16, true, &history);
  EXPECT_TRUE(second.drafting_over());  // no probes, no wasted window
  EXPECT_EQ(second.next(), 1);
}

TEST(BlockController, KeepsTheBlockAfterASlowFirstStepAndNoisyWindows) {
  BlockController c(16, true);
  probe(c);  // includes a first speculative step 50x a plain one
  for (int w = 0; w < 6; ++w) run_window(c, 16, 0.2e-3, 0.02e-3 * (1 + w % 2));
  EXPECT_EQ(c.next(), 16);
  EXPECT_FALSE(c.drafting_over());
}

// GPU-like: verifying any number of rows costs about the same (`fixed` over a plain step, 10 µs
// a row more), acceptance lengths cycling through `lengths`. The best block is then the
// shortest that holds the longest length; a model fitted to one block size alone (drafting +
// a plain step + a per-row cost) underprices short blocks: it moved to 4 rows and stayed.
TEST(BlockController, StaysAtTheBestBlockWhenShortBlocksCostTheSame) {
  BlockController c(16, true);
  probe(c);
  const int lengths[] = {3, 3, 8, 4};
  const double draft = 0.5e-3, fixed = 1.9e-3;
  int step = 0;
  std::vector<int> chosen;
  for (int w = 0; w < 12; ++w) {
    for (int i = 0; i < BlockController::kWindowSteps + 1; ++i) {  // + 1: a new size's first step is not timed
      const int b = c.next();
      ASSERT_GT(b, 1) << "speculation pays 1.8x here";
      c.record(b, std::min(lengths[step++ % 4], b), draft + fixed + 0.01e-3 * (b - 1), draft);
    }
    chosen.push_back(c.next());
  }
  EXPECT_EQ(c.next(), 8) << ::testing::PrintToString(chosen);
  EXPECT_FALSE(c.drafting_over());
}

// What the history carries: the next request starts at the block the first one settled on.
TEST(BlockController, LaterRequestsStartAtTheBlockThatPaid) {
  SpeculationHistory history;
  const int lengths[] = {3, 3, 8, 4};
  auto run = [&](BlockController& c, int windows) {
    int step = 0;
    for (int i = 0; i < windows * (BlockController::kWindowSteps + 1); ++i) {
      const int b = c.next();
      if (b == 1) {
        c.record(1, 1, 1e-3);
        continue;
      }
      c.record(b, std::min(lengths[step++ % 4], b), 2.4e-3 + 0.01e-3 * (b - 1), 0.5e-3);
    }
  };
  {
    BlockController first(16, true, &history);
    probe(first);
    run(first, 12);
    EXPECT_EQ(first.next(), 8);
  }
  BlockController second(16, true, &history);
  EXPECT_EQ(second.next(), 8);  // no probes: the costs and rates are known
  run(second, 4);
  EXPECT_EQ(second.next(), 8);
}

// Acceptance that improves after the block was shortened (a prompt whose easy part comes
// later): the rows past the short block are measured again in the exploring windows, and the
// block grows back to the full 16 rows. Without them the block stayed at 3, priced on the
// first steps' rates.
TEST(BlockController, GrowsBackWhenLaterRowsStartBeingAccepted) {
  BlockController c(16, true);
  probe(c);
  auto steps = [&](int count, const std::vector<int>& lengths) {
    for (int i = 0; i < count; ++i) {
      const int b = c.next();
      ASSERT_GT(b, 1);
      c.record(b, std::min(lengths[i % lengths.size()], b), 0.5e-3 + 1.9e-3 + 0.01e-3 * (b - 1), 0.5e-3);
    }
  };
  steps(30, {2, 3, 2, 3});
  ASSERT_LT(c.block(), 8) << "the short phase chose a short block";
  steps(200, {16});
  EXPECT_EQ(c.block(), 16);
  bool explored = false;
  for (const auto& e : c.take_events()) explored = explored || e.find("one window at block") != std::string::npos;
  EXPECT_TRUE(explored);
}

TEST(BlockController, FixedWhenNotAdaptive) {
  BlockController c(8, false);
  EXPECT_EQ(c.next(), 8);
  run_window(c, 1, 5e-3, 5e-3);
  EXPECT_EQ(c.next(), 8);
}

}  // namespace
