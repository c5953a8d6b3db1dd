#include "server/request_queue.h"

#include <algorithm>

namespace dflash::server {

RequestQueue::RequestQueue(size_t capacity, std::function<void(Job&)> run)
    : capacity_(capacity), run_(std::move(run)), thread_([this] { worker(); }) {}

RequestQueue::~RequestQueue() {
  shutdown();
  join();
}

RequestQueue::Admission RequestQueue::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard lock(mu_);
    if (closed_) return Admission::ShuttingDown;
    // With the engine idle the next request starts at once, so it does not count as waiting.
    if (waiting_.size() >= capacity_ + (running_ ? 0 : 1)) return Admission::Full;
    waiting_.push_back(std::move(job));
  }
  cv_.notify_all();
  return Admission::Accepted;
}

bool RequestQueue::withdraw(const std::shared_ptr<Job>& job) {
  std::lock_guard lock(mu_);
  auto it = std::find(waiting_.begin(), waiting_.end(), job);
  if (it == waiting_.end()) return false;
  waiting_.erase(it);
  return true;
}

void RequestQueue::shutdown() {
  std::deque<std::shared_ptr<Job>> refused;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    refused.swap(waiting_);
  }
  cv_.notify_all();
  for (auto& job : refused)
    job->set_state(Job::State::Refused,
                   ApiError(503, "service_unavailable", "shutting_down", "the server is shutting down"));
}

void RequestQueue::join() {
  if (thread_.joinable()) thread_.join();
}

QueueGauges RequestQueue::gauges() const {
  std::lock_guard lock(mu_);
  return {waiting_.size(), running_, capacity_};
}

void RequestQueue::worker() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return closed_ || !waiting_.empty(); });
      if (waiting_.empty()) return;  // closed and drained
      job = std::move(waiting_.front());
      waiting_.pop_front();
      running_ = 1;
    }
    run_(*job);
    std::lock_guard lock(mu_);
    running_ = 0;
  }
}

}  // namespace dflash::server
