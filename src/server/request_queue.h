#pragma once
// FIFO admission in front of the single engine worker: the Engine runs one generation at a
// time, so requests wait here in arrival order, up to a fixed depth beyond which they are
// refused at once rather than left to pile up.
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "server/job.h"
#include "server/metrics.h"

namespace dflash::server {

class RequestQueue {
 public:
  enum class Admission { Accepted, Full, ShuttingDown };

  // `run` executes one job on the worker thread; it must not throw.
  RequestQueue(size_t capacity, std::function<void(Job&)> run);
  ~RequestQueue();

  Admission submit(std::shared_ptr<Job> job);
  // Takes back a job that is still waiting (its deadline passed); false once the worker has it.
  bool withdraw(const std::shared_ptr<Job>& job);
  // Refuses every waiting job with 503 and admits no more; the running job finishes.
  void shutdown();
  // Waits for the worker to finish the running job and exit (after shutdown()).
  void join();
  QueueGauges gauges() const;

 private:
  void worker();
  const size_t capacity_;
  std::function<void(Job&)> run_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> waiting_;
  size_t running_ = 0;
  bool closed_ = false;
  std::thread thread_;
};

}  // namespace dflash::server
