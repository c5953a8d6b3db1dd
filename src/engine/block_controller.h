#pragma once
// Chooses how many drafted rows each step verifies, from what steps actually cost here
// (contract section 6). It times a few plain one-token steps first; then, after each window of
// speculative steps, it models every block size b from the measurements — tokens per step
// from the per-row acceptance rates seen so far in this request, step time from the steps
// timed at each block size so far — and takes the best b. When no b keeps 95% of plain
// decoding's speed, speculation is switched off for the request.
//
// Step time of a block size not timed yet: on the line through the timed sizes, with drafting
// plus one plain step standing for b = 1 (between two timed sizes, the straight line between
// them; past the largest, that line's slope from b = 1). With one timed size this is the
// linear model "drafting + a plain step + a per-row cost", right on a CPU, where each row costs
// about the same; on a GPU a 4-row verification costs nearly what a 16-row one does, and the
// line fitted at a shortened block alone prices the longer ones far above their time
// (tests/block_controller_test.cc). Each size's own mean, once timed, replaces the line. (The
// shipped pair's block stuck at 4 on the H200 needed the exploring windows below as well: its
// rows past 4 had been measured only in its first few steps; docs/benchmarks.md, nineteenth
// pass.)
#include <string>
#include <vector>

namespace dflash {

// What earlier requests on the same engine measured: step costs are properties of the model
// and the machine, acceptance rates a prior for the next request. With them a request starts
// at the block that paid before (or without drafting) instead of paying for a probe.
struct SpeculationHistory {
  double plain_seconds = 0;                // best one-token step; 0 = not measured yet
  double draft_seconds = 0;                // summed over draft_steps timed steps
  long draft_steps = 0;
  std::vector<double> step_seconds;        // per block size b: summed over step_count[b] timed steps
  std::vector<long> step_count;
  bool costs_known = false;
  std::vector<long> reached, accepted;    // per block row, summed over requests
  long requests = 0;
};

class BlockController {
 public:
  // `history` may be null (no memory across requests).
  BlockController(int max_block, bool adaptive, SpeculationHistory* history = nullptr);
  // Folds this request's measurements into the history.
  ~BlockController();
  BlockController(const BlockController&) = delete;
  BlockController& operator=(const BlockController&) = delete;

  int next() const;  // rows of the next step; 1 means a plain step
  bool drafting_over() const { return off_; }
  int block() const { return block_; }  // the chosen block (an exploring window aside)
  // One step: `seconds` in all, `draft_seconds` of it drafting (0 for plain steps);
  // `committed_tokens` is the acceptance length (1 for a plain step).
  void record(int block, int committed_tokens, double seconds, double draft_seconds = 0);
  std::vector<std::string> take_events() { return std::move(events_); }

  // The first plain step after prefill runs on cold caches and a sleeping thread pool, at
  // half speed or worse: it is taken but not timed. So is the first speculative step at each
  // block size (first use of the block's shapes: on a GPU, fresh scratch allocations), whose
  // time once sent a block that pays 2.2x down to 2 rows.
  static constexpr int kProbeSteps = 4;
  static constexpr int kWindowSteps = 4;
  static constexpr double kTolerance = 0.95;  // speculation must keep 95% of plain speed
  static constexpr double kPriorWeight = 8;    // pseudo-observations a row's prior rate counts for
  static constexpr long kExploreEvery = 8;     // a request in this many re-tries speculation
  // Below the largest block, one window in this many verifies twice the rows (at most the
  // largest), for the rows and sizes the shorter block no longer measures: their acceptance
  // rates were otherwise frozen at what the first few steps showed, and a block shortened on
  // them never grew back. Only while the first row past the block has been tried fewer than
  // kExploreSamples times (this request and the history together): the windows cost what the
  // longer block costs, which on a CPU is more.
  static constexpr int kExploreWindows = 8;
  static constexpr long kExploreSamples = 32;

 private:
  void decide(int block, double step, double draft);
  void choose_block(const char* why);
  // Expected acceptance length when verifying b rows, from this request's row rates.
  double expected_tokens(int b) const;
  // Modelled seconds of a speculative step of b rows (see the top of the file).
  double step_seconds(int b) const;

  int max_block_, block_;
  bool adaptive_;
  bool off_ = false;
  int probes_done_ = 0;
  double plain_seconds_ = 0;  // best observed one-token step
  std::vector<long> reached_, accepted_;  // per block row 1 … max_block − 1
  int window_steps_ = 0;
  double window_seconds_ = 0, window_draft_seconds_ = 0;
  int explore_block_ = 0;  // > 0: the current window verifies this many rows instead of block_
  int windows_since_explore_ = 0;
  // This request's timed speculative steps (the cold first one left out): their drafting, and
  // the whole steps per block size b. The model adds the history's sums to these.
  double draft_seconds_ = 0;
  long draft_steps_ = 0;
  std::vector<double> step_seconds_;
  std::vector<long> step_count_;
  std::vector<char> size_warm_;  // per block size: its first step in this request was taken
  SpeculationHistory* history_;
  std::vector<std::string> events_;
};

}  // namespace dflash
