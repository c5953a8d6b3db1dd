#include "server/metrics.h"

#include <cstdio>

namespace dflash::server {
namespace {

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += " ";
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += " ";
  out += type;
  out += "\n";
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name;
  if (!labels.empty()) out += "{" + labels + "}";
  // appended piece by piece: GCC 12 warns falsely (-Wrestrict) on a literal + a temporary string
  out.append(" ").append(num(v)).append("\n");
}

void single(std::string& out, const char* name, const char* type, const char* help, double v) {
  header(out, name, type, help);
  sample(out, name, "", v);
}

}  // namespace

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::count_rejection(const std::string& reason) {
  std::lock_guard lock(mu_);
  ++rejections_[reason];
}

void Metrics::record_generation(const GenerationStats& stats, const std::string& finish, double queue_seconds) {
  std::lock_guard lock(mu_);
  totals_.merge(stats);
  ++generations_;
  ++finishes_[finish];
  queue_seconds_ += queue_seconds;
}

std::string Metrics::render(const QueueGauges& q) const {
  std::lock_guard lock(mu_);
  std::string out;
  header(out, "dflash_requests_total", "counter", "HTTP requests answered, by endpoint and status code.");
  for (const auto& [key, n] : requests_)
    sample(out, "dflash_requests_total", "endpoint=\"" + key.first + "\",code=\"" + std::to_string(key.second) + "\"", double(n));
  header(out, "dflash_rejected_requests_total", "counter", "Requests refused before generation, by reason.");
  for (const char* r : {"queue_full", "shutting_down", "queue_timeout"}) {
    auto it = rejections_.find(r);
    sample(out, "dflash_rejected_requests_total", std::string("reason=\"") + r + "\"",
           double(it == rejections_.end() ? 0 : it->second));
  }
  header(out, "dflash_generations_total", "counter", "Generations run on the engine, by finish reason.");
  for (const auto& [reason, n] : finishes_)
    sample(out, "dflash_generations_total", "finish_reason=\"" + reason + "\"", double(n));

  single(out, "dflash_prompt_tokens_total", "counter", "Prompt tokens prefilled.", double(totals_.prompt_tokens));
  single(out, "dflash_generation_tokens_total", "counter", "Tokens generated (committed by the engine).",
         double(totals_.generated_tokens));
  single(out, "dflash_speculative_steps_total", "counter", "Draft-and-verify steps.", double(totals_.steps));
  single(out, "dflash_plain_steps_total", "counter", "One-token steps (no drafter, or speculation switched off).",
         double(totals_.plain_steps));

  header(out, "dflash_acceptance_length", "histogram", "Acceptance length per speculative step (1 ... block size).");
  int64_t cumulative = 0, sum = 0;
  for (size_t i = 0; i < totals_.acceptance_histogram.size(); ++i) {
    cumulative += totals_.acceptance_histogram[i];
    sum += totals_.acceptance_histogram[i] * int64_t(i + 1);
    sample(out, "dflash_acceptance_length_bucket", "le=\"" + std::to_string(i + 1) + "\"", double(cumulative));
  }
  sample(out, "dflash_acceptance_length_bucket", "le=\"+Inf\"", double(cumulative));
  sample(out, "dflash_acceptance_length_sum", "", double(sum));
  sample(out, "dflash_acceptance_length_count", "", double(cumulative));

  header(out, "dflash_position_drafted_total", "counter", "Steps where draft row i was tried (rows before it accepted).");
  for (size_t i = 1; i < totals_.row_reached.size(); ++i)
    sample(out, "dflash_position_drafted_total", "position=\"" + std::to_string(i) + "\"", double(totals_.row_reached[i]));
  header(out, "dflash_position_accepted_total", "counter", "Steps where draft row i was accepted.");
  for (size_t i = 1; i < totals_.row_accepted.size(); ++i)
    sample(out, "dflash_position_accepted_total", "position=\"" + std::to_string(i) + "\"", double(totals_.row_accepted[i]));
  header(out, "dflash_position_acceptance_ratio", "gauge", "Accepted over tried, per draft row.");
  // Rows never tried (the adaptive block stayed shorter) have no ratio, rather than a false 0.
  const auto rates = totals_.per_position_acceptance();
  for (size_t i = 0; i < rates.size(); ++i)
    if (totals_.row_reached[i + 1] > 0)
      sample(out, "dflash_position_acceptance_ratio", "position=\"" + std::to_string(i + 1) + "\"", rates[i]);

  single(out, "dflash_prefill_seconds_total", "counter", "Seconds spent in prompt prefill.", totals_.prefill_seconds);
  single(out, "dflash_draft_seconds_total", "counter", "Seconds spent drafting.", totals_.draft_seconds);
  single(out, "dflash_verify_seconds_total", "counter", "Seconds spent verifying drafts.", totals_.verify_seconds);
  single(out, "dflash_plain_decode_seconds_total", "counter", "Seconds spent in one-token steps.", totals_.plain_seconds);
  single(out, "dflash_generation_seconds_total", "counter", "Seconds the engine spent generating.", totals_.total_seconds);
  single(out, "dflash_queue_wait_seconds_total", "counter", "Seconds requests waited in the queue.", queue_seconds_);

  single(out, "dflash_queue_depth", "gauge", "Requests waiting for the engine.", double(q.waiting));
  single(out, "dflash_requests_running", "gauge", "Requests being generated.", double(q.running));
  single(out, "dflash_queue_capacity", "gauge", "Maximum requests waiting (--max-queue).", double(q.capacity));
  return out;
}

}  // namespace dflash::server
