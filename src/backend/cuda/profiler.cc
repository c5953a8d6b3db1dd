#include "backend/cuda/profiler.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "backend/cuda/cuda_common.h"

namespace dflash::cuda {

std::unique_ptr<OpProfiler> OpProfiler::from_env(cudaStream_t stream) {
  const char* v = std::getenv("DFLASH_CUDA_PROFILE");
  if (!v || std::strcmp(v, "1") != 0) return nullptr;
  return std::make_unique<OpProfiler>(stream);
}

OpProfiler::OpProfiler(cudaStream_t stream) : stream_(stream), pairs_(kPairs) {
  for (auto& p : pairs_) {
    check(cudaEventCreate(&p.start), "profiler", "cudaEventCreate");
    check(cudaEventCreate(&p.stop), "profiler", "cudaEventCreate");
  }
  check(cudaEventCreate(&first_), "profiler", "cudaEventCreate");
}

OpProfiler::~OpProfiler() {
  // Runs inside the backend's destructor: report what can be reported, throw nothing.
  try {
    flush();
    print(stderr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dflash CUDA profile: %s\n", e.what());
  }
  for (auto& p : pairs_) {
    cudaEventDestroy(p.start);
    cudaEventDestroy(p.stop);
  }
  cudaEventDestroy(first_);
}

int OpProfiler::begin(const char* op, std::string shape) {
  if (used_ == kPairs) flush();
  auto key = std::make_pair(std::string(op), std::move(shape));
  auto it = index_.find(key);
  if (it == index_.end()) {
    it = index_.emplace(key, static_cast<int>(stats_.size())).first;
    stats_.push_back(Stat{key.first, key.second});
  }
  if (!started_) {
    check(cudaEventRecord(first_, stream_), "profiler", "cudaEventRecord");
    started_ = true;
  }
  const int slot = used_++;
  pairs_[slot].stat = it->second;
  check(cudaEventRecord(pairs_[slot].start, stream_), "profiler", "cudaEventRecord");
  pairs_[slot].stop_recorded = false;
  return slot;
}

void OpProfiler::end(int slot) {
  check(cudaEventRecord(pairs_[slot].stop, stream_), "profiler", "cudaEventRecord");
  pairs_[slot].stop_recorded = true;
}

void OpProfiler::flush() {
  if (used_ == 0) return;
  ++flushes_;
  // The stream is in order: once the last recorded event is done, so are all before it.
  int last = used_ - 1;
  while (last >= 0 && !pairs_[last].stop_recorded) --last;
  if (last >= 0) check(cudaEventSynchronize(pairs_[last].stop), "profiler", "cudaEventSynchronize");
  for (int i = 0; i <= last; ++i) {
    if (!pairs_[i].stop_recorded) continue;  // an op that threw before its end
    float ms = 0;
    check(cudaEventElapsedTime(&ms, pairs_[i].start, pairs_[i].stop), "profiler", "cudaEventElapsedTime");
    Stat& s = stats_[size_t(pairs_[i].stat)];
    if (s.calls == 0) s.first_ms = ms;
    ++s.calls;
    s.total_ms += ms;
  }
  if (last >= 0) {
    float wall = 0;
    check(cudaEventElapsedTime(&wall, first_, pairs_[last].stop), "profiler", "cudaEventElapsedTime");
    wall_ms_ = std::max(wall_ms_, double(wall));
  }
  // No pair is open here: ops do not nest, so flush() runs (from begin() or the destructor)
  // only after the previous op's OpTimer has ended.
  used_ = 0;
}

void OpProfiler::print(std::FILE* f) {
  std::vector<const Stat*> order;
  double sum_ms = 0;
  int64_t calls = 0;
  for (const auto& s : stats_) {
    if (s.calls == 0) continue;
    order.push_back(&s);
    sum_ms += s.total_ms;
    calls += s.calls;
  }
  if (order.empty()) return;
  std::sort(order.begin(), order.end(), [](const Stat* a, const Stat* b) { return a->total_ms > b->total_ms; });
  const double gap = wall_ms_ - sum_ms;
  std::fprintf(f,
               "\ndflash CUDA profile (DFLASH_CUDA_PROFILE=1): %lld ops, op time %.3f ms, wall first→last event "
               "%.3f ms, gaps %.3f ms (%.1f %% of wall: launch overhead, host work between ops, %lld profiler "
               "syncs)\n",
               static_cast<long long>(calls), sum_ms, wall_ms_, gap, wall_ms_ > 0 ? 100.0 * gap / wall_ms_ : 0.0,
               static_cast<long long>(flushes_));
  // The mean leaves the first call out (a shape's first cuBLAS call can take milliseconds and
  // would hide a steady cost of tens of microseconds behind it); the first is its own column.
  std::fprintf(f, "%-16s %-36s %9s %12s %10s %10s %7s\n", "op", "shape", "calls", "total ms", "mean us", "first us",
               "% ops");
  for (const Stat* s : order) {
    const double mean_ms = s->calls > 1 ? (s->total_ms - s->first_ms) / double(s->calls - 1) : s->total_ms;
    std::fprintf(f, "%-16s %-36s %9lld %12.3f %10.2f %10.2f %7.2f\n", s->op.c_str(), s->shape.c_str(),
                 static_cast<long long>(s->calls), s->total_ms, 1e3 * mean_ms, 1e3 * s->first_ms,
                 sum_ms > 0 ? 100.0 * s->total_ms / sum_ms : 0.0);
  }
}

}  // namespace dflash::cuda
