#pragma once
// An opt-in per-op profiler for the CUDA backend (DFLASH_CUDA_PROFILE=1): the GPU machine has
// no nsys or ncu, and a decode step is hundreds of small launches whose cost is as much in the
// gaps between them as in the kernels. Each op records a cudaEvent pair around its launches on
// the backend's one stream; pairs are folded into per-(op, shape) totals when the buffer fills
// (after a stream sync) and at the end, and the destructor prints the table to stderr.
#include <cuda_runtime.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dflash::cuda {

class OpProfiler {
 public:
  // Null unless the environment asks for it, so the ops pay one null test when it is off.
  static std::unique_ptr<OpProfiler> from_env(cudaStream_t stream);

  explicit OpProfiler(cudaStream_t stream);
  ~OpProfiler();  // prints the table
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  // Records the start event of one op; the returned slot goes to end().
  int begin(const char* op, std::string shape);
  void end(int slot);
  void print(std::FILE* f);

 private:
  struct Pair {
    cudaEvent_t start = nullptr, stop = nullptr;
    int stat = -1;
    bool stop_recorded = false;
  };
  struct Stat {
    std::string op, shape;
    int64_t calls = 0;
    double total_ms = 0;
    double first_ms = 0;  // the first call alone: it carries one-time costs (cuBLAS loads its kernels)
  };
  // Waits for the recorded pairs and adds them into stats_; the events are then free again.
  void flush();

  static constexpr int kPairs = 4096;
  cudaStream_t stream_;
  std::vector<Pair> pairs_;
  int used_ = 0;
  cudaEvent_t first_ = nullptr;  // the first op's start, kept for the wall time
  bool started_ = false;
  double wall_ms_ = 0;  // first_ to the latest folded stop
  int64_t flushes_ = 0;
  std::map<std::pair<std::string, std::string>, int> index_;
  std::vector<Stat> stats_;
};

// Times one op for its lifetime (or until stop()). The shape label is built only when the
// profiler is on: `shape` is a callable returning std::string.
class OpTimer {
 public:
  template <typename F>
  OpTimer(OpProfiler* p, const char* op, F&& shape) : p_(p) {
    if (p_) [[unlikely]]
      slot_ = p_->begin(op, shape());
  }
  ~OpTimer() { stop(); }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;
  // Ends the timing early: before a host synchronisation, whose wait is not the op's time.
  void stop() {
    if (p_) [[unlikely]] {
      p_->end(slot_);
      p_ = nullptr;
    }
  }

 private:
  OpProfiler* p_;
  int slot_ = -1;
};

}  // namespace dflash::cuda
