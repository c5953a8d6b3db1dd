#pragma once
// One admitted generation request, shared by the HTTP thread that answers it and the engine
// worker that runs it. The worker publishes text and the outcome under `mu`; the HTTP side
// waits on `cv` and reports a vanished client through `client_gone`.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/openai_protocol.h"

namespace dflash::server {

using Clock = std::chrono::steady_clock;

struct Job {
  enum class State { Queued, Running, Done, Refused };

  CompletionRequest request;
  std::vector<int32_t> prompt;
  int max_tokens = 0;
  ResponseMeta meta;
  Clock::time_point arrival = Clock::now();
  Clock::time_point deadline = Clock::time_point::max();

  std::atomic<bool> client_gone{false};

  std::mutex mu;
  std::condition_variable cv;
  State state = State::Queued;
  std::string pending;  // text produced but not yet taken by the HTTP side
  std::string finish_reason;
  bool timed_out = false;
  Usage usage;
  std::optional<ApiError> error;  // set with Done (generation failed) or Refused

  void set_state(State s, std::optional<ApiError> err = std::nullopt) {
    {
      std::lock_guard lock(mu);
      state = s;
      if (err) error = std::move(err);
    }
    cv.notify_all();
  }
  void append(const std::string& text) {
    if (text.empty()) return;
    {
      std::lock_guard lock(mu);
      pending += text;
    }
    cv.notify_all();
  }
};

}  // namespace dflash::server
