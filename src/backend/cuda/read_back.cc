#include "backend/cuda/read_back.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_common.h"

namespace dflash::cuda {

ReadBack::~ReadBack() {
  if (host_) cudaFreeHost(host_);
}

const char* ReadBack::read(const void* dev, size_t bytes, const char* op, OpTimer* timer) {
  if (bytes > bytes_) {
    if (host_) check(cudaFreeHost(host_), op, "freeing pinned read-back memory");
    host_ = nullptr;
    bytes_ = 0;
    const size_t want = std::max<size_t>(bytes, size_t(64) << 10);
    check(cudaHostAlloc(&host_, want, cudaHostAllocDefault), op, "allocating pinned read-back memory");
    bytes_ = want;
  }
  check(cudaMemcpyAsync(host_, dev, bytes, cudaMemcpyDeviceToHost, stream_), op, "device to host copy");
  if (timer) timer->stop();
  check(cudaStreamSynchronize(stream_), op, "synchronising the stream");
  return static_cast<const char*>(host_);
}

void ReadBack::copy(void* host, const void* dev, size_t bytes, const char* op, OpTimer* timer) {
  std::memcpy(host, read(dev, bytes, op, timer), bytes);
}

}  // namespace dflash::cuda
