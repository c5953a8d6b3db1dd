#pragma once
// Acceptance statistics (contract section 5): mean acceptance length τ, its histogram over
// 1 … B, per-position acceptance, and where the time went.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dflash {

struct GenerationStats {
  int max_block_size = 0;    // most rows verified in a step
  int draft_block_size = 0;  // rows the drafter drafts per step
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  // Of generated_tokens, those the prefill chose (one a request): decoding did not make them.
  int64_t first_tokens = 0;
  int64_t steps = 0;        // speculative steps (draft + verify)
  int64_t plain_steps = 0;  // one-token steps (plain decoding, or speculation switched off)
  int64_t discarded_steps = 0;  // steps queued ahead of a stop the host could not foresee
  int64_t recorded_verifications = 0;  // steps whose verification the backend recorded (a CUDA graph)
  // Device seconds those recordings waited for the host after the draft (engine/recording_rule.h).
  double recording_wait_seconds = 0, recording_wait_max_seconds = 0;
  std::vector<int64_t> acceptance_histogram;  // [L − 1] counts steps with acceptance length L
  std::vector<int64_t> steps_by_rows;         // [b − 1] counts steps that verified b rows (the controller's choices)
  std::vector<int> step_acceptance;           // acceptance length of each step, in order
  std::vector<int64_t> row_reached;   // [i] steps where row i − 1 was accepted (row 0: every step)
  std::vector<int64_t> row_accepted;  // [i] steps where row i was accepted
  double prefill_seconds = 0, draft_seconds = 0, verify_seconds = 0, plain_seconds = 0, total_seconds = 0;
  std::vector<std::string> adaptive_events;  // block changes and fallbacks, in order
  int final_block_size = 0;

  void record_step(int block_size, int acceptance_length);
  // A request's end: its tokens (the first of them the prefill's) and its time in all.
  void finish_request(int64_t tokens, double seconds);
  double mean_acceptance_length() const;
  std::vector<double> per_position_acceptance() const;  // rows 1 … B−1
  // Tokens decoding made (generated_tokens − first_tokens) over the time after prefill.
  double decode_tokens_per_second() const;
  void merge(const GenerationStats& other);

  nlohmann::json to_json() const;
  std::string to_text() const;
};

}  // namespace dflash
