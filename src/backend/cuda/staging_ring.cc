#include "backend/cuda/staging_ring.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_common.h"

namespace dflash::cuda {

StagingRing::StagingRing(cudaStream_t stream) : stream_(stream) {
  check(cudaHostAlloc(&host_, kSlots * kSlotBytes, cudaHostAllocDefault), "init", "allocating pinned staging memory");
  events_.resize(kSlots);
  for (auto& e : events_) {
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "init", "cudaEventCreate");
    check(cudaEventRecord(e, stream_), "init", "cudaEventRecord");  // "free" from the start
  }
}

StagingRing::~StagingRing() {
  for (auto e : events_)
    if (e) cudaEventDestroy(e);
  cudaFreeHost(host_);
}

void StagingRing::copy(const std::vector<int32_t>& v, void* dev, const char* op) {
  const size_t bytes = v.size() * sizeof(int32_t);
  if (bytes > kSlotBytes) {
    check(cudaMemcpyAsync(dev, v.data(), bytes, cudaMemcpyHostToDevice, stream_), op,
          "host to device copy of indices");
    return;
  }
  const size_t slot = next_slot_++ % kSlots;
  check(cudaEventSynchronize(events_[slot]), op, "waiting for a staging slot");
  char* host = static_cast<char*>(host_) + slot * kSlotBytes;
  std::memcpy(host, v.data(), bytes);
  check(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_), op, "host to device copy of indices");
  check(cudaEventRecord(events_[slot], stream_), op, "recording a staging event");
}

void StagingRing::restart_events(size_t first) {
  const size_t n = std::min(next_slot_ - first, kSlots);
  for (size_t i = 0; i < n; ++i)
    check(cudaEventRecord(events_[(first + i) % kSlots], stream_), "capture", "recording a staging event");
}

}  // namespace dflash::cuda
