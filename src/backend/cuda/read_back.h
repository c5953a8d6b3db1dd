#pragma once
// Results the host waits for (argmax ids, sampling candidates, laws, draws): copied into pinned
// host memory, grown on demand, then the stream synchronised. Pinned rather than pageable
// memory took `dflash doctor`'s top-p call on 16 rows of 2048 candidate slots, 256 KiB, from
// 195.8 to 126.0 µs (H200).
#include <cuda_runtime.h>

#include <cstddef>

#include "backend/cuda/profiler.h"

namespace dflash::cuda {

class ReadBack {
 public:
  explicit ReadBack(cudaStream_t stream) : stream_(stream) {}
  ~ReadBack();
  ReadBack(const ReadBack&) = delete;
  ReadBack& operator=(const ReadBack&) = delete;

  // The bytes at dev once the work queued so far ran, valid until the next read. The op's
  // timer, if any, stops before the wait (the profiler times the op, not the host's wait).
  const char* read(const void* dev, size_t bytes, const char* op, OpTimer* timer = nullptr);
  void copy(void* host, const void* dev, size_t bytes, const char* op, OpTimer* timer = nullptr);

 private:
  cudaStream_t stream_;
  void* host_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace dflash::cuda
