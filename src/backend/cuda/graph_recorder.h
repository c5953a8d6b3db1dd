#pragma once
// Steps recorded as CUDA graphs (Backend::queue_recorded) and the measurement of what that
// saves (dflash bench --graph-probe). A graph per key, captured from each call and launched;
// the executable graph is updated from the new capture (cheaper than instantiating) and
// instantiated again when the update is refused (counts() says how often). Two executables a
// key, used in turn, so the one updated is not the one the previous call launched.
#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/staging_ring.h"

namespace dflash::cuda {

class GraphRecorder {
 public:
  // Captures on `stream`, whose small uploads go through `staging` (events recorded during a
  // capture belong to it, so the ring's are recorded again after each launch).
  GraphRecorder(cudaStream_t stream, StagingRing& staging) : stream_(stream), staging_(staging) {}
  ~GraphRecorder();
  GraphRecorder(const GraphRecorder&) = delete;
  GraphRecorder& operator=(const GraphRecorder&) = delete;

  // Records what step() queues under `key` and launches it; before_launch() runs between the
  // recording's update (or instantiation) and its launch.
  void queue(const std::string& key, const std::function<void()>& step, const std::function<void()>& before_launch);
  // cuda::graph_probe (cuda_backend.h).
  GraphProbe probe(const std::function<void()>& step, int reps);
  GraphCounts counts() const { return counts_; }

 private:
  // What step() queues, as a graph (stream capture; relaxed, because the staging ring waits on
  // its events and the pool may call cudaMalloc). The caller restarts the staging events taken
  // since the capture began once the graph is launched; this does when step() throws.
  cudaGraph_t capture(const std::function<void()>& step, const char* op);

  struct RecordedStep {
    cudaGraphExec_t exec[2] = {nullptr, nullptr};
    int next = 0;
  };
  cudaStream_t stream_;
  StagingRing& staging_;
  std::map<std::string, RecordedStep> recorded_;  // by key
  GraphCounts counts_;
};

}  // namespace dflash::cuda
