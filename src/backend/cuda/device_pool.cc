#include "backend/cuda/device_pool.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_common.h"

namespace dflash::cuda {

namespace {

// Rounded so that a request repeated every step (same shapes) finds its own block again, and
// large requests waste at most an eighth.
size_t round_size(size_t bytes) {
  if (bytes <= (size_t(1) << 20)) return (std::max<size_t>(bytes, 1) + 511) / 512 * 512;
  size_t step = 1;
  while (step * 16 <= bytes) step <<= 1;
  return (bytes + step - 1) / step * step;
}

}  // namespace

DevicePool::~DevicePool() {
  // At process exit the runtime may already be gone; nothing useful can be done with errors.
  for (auto& [size, p] : free_) cudaFree(p);
}

std::shared_ptr<void> DevicePool::allocate(size_t bytes, const char* op) {
  const size_t size = round_size(bytes);
  void* p = nullptr;
  size_t got = size;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.lower_bound(size);
    // A cached block at most twice the request: larger ones stay for larger requests.
    if (it != free_.end() && it->first <= 2 * size) {
      p = it->second;
      got = it->first;
      free_.erase(it);
      cached_ -= got;
    }
  }
  if (!p) p = malloc_block(size, op);
  return take(p, got);
}

std::shared_ptr<void> DevicePool::allocate_fresh(size_t bytes, const char* op) {
  const size_t size = round_size(bytes);
  return take(malloc_block(size, op), size);
}

void* DevicePool::malloc_block(size_t size, const char* op) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, size);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear it: the retry decides
    release_cached();
    e = cudaMalloc(&p, size);
  }
  check(e, op, ("allocating " + std::to_string(size) + " bytes of device memory").c_str());
  return p;
}

std::shared_ptr<void> DevicePool::take(void* p, size_t got) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_ += got;
    peak_ = std::max(peak_, live_);
  }
  auto self = shared_from_this();
  return std::shared_ptr<void>(p, [self, got](void* q) { self->put(q, got); });
}

void DevicePool::put(void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.emplace(bytes, p);
  cached_ += bytes;
  live_ -= bytes;
}

void DevicePool::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, p] : free_) cudaFree(p);
  free_.clear();
  cached_ = 0;
}

}  // namespace dflash::cuda
