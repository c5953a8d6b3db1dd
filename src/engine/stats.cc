#include "engine/stats.h"

#include <algorithm>
#include <cstdio>

namespace dflash {

namespace {
void grow(std::vector<int64_t>& v, size_t n) {
  if (v.size() < n) v.resize(n, 0);
}
}  // namespace

void GenerationStats::record_step(int block_size, int acceptance_length) {
  ++steps;
  max_block_size = std::max(max_block_size, block_size);
  grow(acceptance_histogram, block_size);
  grow(steps_by_rows, block_size);
  ++steps_by_rows[block_size - 1];
  grow(row_reached, block_size);
  grow(row_accepted, block_size);
  ++acceptance_histogram[acceptance_length - 1];
  step_acceptance.push_back(acceptance_length);
  // Row i (1 … B−1) was tried when rows before it were accepted.
  for (int i = 1; i < block_size && i <= acceptance_length; ++i) {
    ++row_reached[i];
    if (i < acceptance_length) ++row_accepted[i];
  }
}

double GenerationStats::mean_acceptance_length() const {
  int64_t n = 0, sum = 0;
  for (size_t i = 0; i < acceptance_histogram.size(); ++i) {
    n += acceptance_histogram[i];
    sum += acceptance_histogram[i] * int64_t(i + 1);
  }
  return n ? double(sum) / double(n) : 0.0;
}

std::vector<double> GenerationStats::per_position_acceptance() const {
  std::vector<double> out;
  for (size_t i = 1; i < row_reached.size(); ++i)
    out.push_back(row_reached[i] ? double(row_accepted[i]) / double(row_reached[i]) : 0.0);
  return out;
}

void GenerationStats::finish_request(int64_t tokens, double seconds) {
  generated_tokens = tokens;
  first_tokens = tokens > 0 ? 1 : 0;
  total_seconds = seconds;
}

double GenerationStats::decode_tokens_per_second() const {
  const double t = total_seconds - prefill_seconds;
  return t > 0 ? double(generated_tokens - first_tokens) / t : 0.0;
}

void GenerationStats::merge(const GenerationStats& o) {
  max_block_size = std::max(max_block_size, o.max_block_size);
  draft_block_size = std::max(draft_block_size, o.draft_block_size);
  prompt_tokens += o.prompt_tokens;
  generated_tokens += o.generated_tokens;
  first_tokens += o.first_tokens;
  steps += o.steps;
  plain_steps += o.plain_steps;
  discarded_steps += o.discarded_steps;
  recorded_verifications += o.recorded_verifications;
  recording_wait_seconds += o.recording_wait_seconds;
  recording_wait_max_seconds = std::max(recording_wait_max_seconds, o.recording_wait_max_seconds);
  auto add = [](std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    grow(a, b.size());
    for (size_t i = 0; i < b.size(); ++i) a[i] += b[i];
  };
  add(acceptance_histogram, o.acceptance_histogram);
  add(steps_by_rows, o.steps_by_rows);
  add(row_reached, o.row_reached);
  add(row_accepted, o.row_accepted);
  prefill_seconds += o.prefill_seconds;
  draft_seconds += o.draft_seconds;
  verify_seconds += o.verify_seconds;
  plain_seconds += o.plain_seconds;
  total_seconds += o.total_seconds;
}

nlohmann::json GenerationStats::to_json() const {
  return {
      {"prompt_tokens", prompt_tokens},
      {"generated_tokens", generated_tokens},
      {"steps", steps},
      {"first_tokens", first_tokens},
      {"plain_steps", plain_steps},
      {"discarded_steps", discarded_steps},
      {"recorded_verifications", recorded_verifications},
      {"recording_wait_seconds", recording_wait_seconds},
      {"recording_wait_max_seconds", recording_wait_max_seconds},
      {"max_block_size", max_block_size},
      {"draft_block_size", draft_block_size},
      {"final_block_size", final_block_size},
      {"mean_acceptance_length", mean_acceptance_length()},
      {"acceptance_histogram", acceptance_histogram},
      {"steps_by_rows", steps_by_rows},
      {"per_position_acceptance", per_position_acceptance()},
      {"prefill_seconds", prefill_seconds},
      {"draft_seconds", draft_seconds},
      {"verify_seconds", verify_seconds},
      {"plain_step_seconds", plain_seconds},
      {"other_seconds", std::max(0.0, total_seconds - prefill_seconds - draft_seconds - verify_seconds - plain_seconds)},
      {"total_seconds", total_seconds},
      {"decode_tokens_per_second", decode_tokens_per_second()},
      {"adaptive_events", adaptive_events},
  };
}

std::string GenerationStats::to_text() const {
  char buf[512];
  std::string s;
  std::snprintf(buf, sizeof buf, "tokens: %lld prompt, %lld generated (%lld of them decoded); %.1f tokens/s decoding\n",
                (long long)prompt_tokens, (long long)generated_tokens, (long long)(generated_tokens - first_tokens),
                decode_tokens_per_second());
  s += buf;
  std::snprintf(buf, sizeof buf, "time: prefill %.3fs, draft %.3fs, verify %.3fs, plain steps %.3fs, other %.3fs\n",
                prefill_seconds, draft_seconds, verify_seconds, plain_seconds,
                std::max(0.0, total_seconds - prefill_seconds - draft_seconds - verify_seconds - plain_seconds));
  s += buf;
  if (steps) {
    std::snprintf(buf, sizeof buf,
                  "speculative steps: %lld (+%lld plain), mean acceptance length %.2f (verifying up to %d rows of "
                  "%d-token drafted blocks)\n",
                  (long long)steps, (long long)plain_steps, mean_acceptance_length(), max_block_size, draft_block_size);
    s += buf;
    if (recorded_verifications) {
      std::snprintf(buf, sizeof buf,
                    "verifications queued as one recording (a CUDA graph): %lld of %lld; the device waited for the "
                    "host %.1f us a recording (longest %.1f)\n",
                    (long long)recorded_verifications, (long long)steps,
                    1e6 * recording_wait_seconds / double(recorded_verifications), 1e6 * recording_wait_max_seconds);
      s += buf;
    }
    s += "acceptance histogram (length: steps):";
    // appended piece by piece: GCC 12 warns falsely (-Wrestrict) on a literal + a temporary string
    for (size_t i = 0; i < acceptance_histogram.size(); ++i)
      s.append(" ").append(std::to_string(i + 1)).append(":").append(std::to_string(acceptance_histogram[i]));
    s += "\nsteps by rows verified:";
    for (size_t i = 0; i < steps_by_rows.size(); ++i)
      if (steps_by_rows[i]) s.append(" ").append(std::to_string(i + 1)).append(":").append(std::to_string(steps_by_rows[i]));
    s += "\nper-position acceptance:";
    const auto rates = per_position_acceptance();
    for (size_t i = 0; i < rates.size(); ++i) {
      std::snprintf(buf, sizeof buf, " %zu:%.2f", i + 1, rates[i]);
      s += buf;
    }
    s += "\n";
  }
  for (const auto& e : adaptive_events) s += "adaptive: " + e + "\n";
  return s;
}

}  // namespace dflash
