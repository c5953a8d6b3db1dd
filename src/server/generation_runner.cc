#include "server/generation_runner.h"

#include <thread>

#include "server/text_stream.h"
#include "util/error.h"

namespace dflash::server {

void GenerationRunner::run(Job& job) {
  const Clock::time_point started = Clock::now();
  const double queue_seconds = std::chrono::duration<double>(started - job.arrival).count();
  job.set_state(Job::State::Running);
  try {
    TextStream text(tokenizer_, job.request.stop);
    bool timed_out = false;
    GenerationRequest g;
    g.prompt = job.prompt;
    g.max_new_tokens = job.max_tokens;
    g.sampling = job.request.sampling;
    if (!job.request.ignore_eos) g.eos_ids = eos_ids_;
    g.on_tokens = [&](const int32_t* ids, size_t n) {
      job.append(text.push(ids, n));
      if (slowdown_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slowdown_ms_));
    };
    g.stop_check = [&](const std::vector<int32_t>&) { return text.stopped(); };
    g.cancelled = [&] {
      if (job.client_gone || abort_) return true;
      if (Clock::now() >= job.deadline) timed_out = true;
      return timed_out;
    };

    GenerationResult res;
    if (g.cancelled()) {
      res.finish = FinishReason::Cancelled;  // gone or out of time before it started
      res.stats.prompt_tokens = 0;
    } else {
      res = engine_.generate(g);
    }
    job.append(text.finish());
    // A deadline cuts the output short like a token limit does; the response says which.
    std::string finish = res.finish == FinishReason::Stop ? "stop" : "length";
    metrics_.record_generation(res.stats, res.finish == FinishReason::Cancelled ? (timed_out ? "timeout" : "cancelled") : finish,
                               queue_seconds);
    {
      std::lock_guard lock(job.mu);
      job.finish_reason = finish;
      job.timed_out = timed_out;
      job.usage = {static_cast<int64_t>(job.prompt.size()), static_cast<int64_t>(res.tokens.size())};
    }
    job.set_state(Job::State::Done);
  } catch (const Error& e) {
    // The request was validated up front, so the engine refusing it is still the client's doing.
    job.set_state(Job::State::Done, bad_request(e.what(), {}, "invalid_request"));
  } catch (const std::exception& e) {
    job.set_state(Job::State::Done, ApiError(500, "server_error", "internal_error", std::string("generation failed: ") + e.what()));
  } catch (...) {
    job.set_state(Job::State::Done, ApiError(500, "server_error", "internal_error", "generation failed"));
  }
}

}  // namespace dflash::server
