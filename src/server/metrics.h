#pragma once
// Server counters in the Prometheus text exposition format. Engine statistics are merged
// per finished request; gauges (queue depth, running) are read when scraped.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "engine/stats.h"

namespace dflash::server {

struct QueueGauges {
  size_t waiting = 0;
  size_t running = 0;
  size_t capacity = 0;
};

class Metrics {
 public:
  // One finished HTTP request on a generation or info endpoint.
  void count_request(const std::string& endpoint, int status);
  // A request refused before generation (queue_full, shutting_down, queue_timeout).
  void count_rejection(const std::string& reason);
  // One generation that ran on the engine; `finish` is the reported finish_reason.
  void record_generation(const GenerationStats& stats, const std::string& finish, double queue_seconds);
  std::string render(const QueueGauges& q) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  std::map<std::string, int64_t> rejections_;
  std::map<std::string, int64_t> finishes_;
  GenerationStats totals_;  // merged over every generation
  int64_t generations_ = 0;
  double queue_seconds_ = 0;
};

}  // namespace dflash::server
