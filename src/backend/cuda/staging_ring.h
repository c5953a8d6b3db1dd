#pragma once
// Small host arrays (ids, positions) on their way to the device. A copy from pageable memory may
// make the driver wait for the stream, so they go through a ring of pinned slots; a slot is
// reused only after the copy that last read it has run (its event), which with kSlots slots is
// long done. Larger arrays (a long prompt's ids) take the pageable path.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dflash::cuda {

class StagingRing {
 public:
  static constexpr size_t kSlots = 64, kSlotBytes = 16 << 10;

  explicit StagingRing(cudaStream_t stream);
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // Queues dev ← v on the stream.
  void copy(const std::vector<int32_t>& v, void* dev, const char* op);

  // Slots taken so far (a count that only grows).
  size_t taken() const { return next_slot_; }
  // Events recorded while the stream was capturing belong to the capture: the slots taken since
  // `first` (all of them if the ring went round) get theirs again on the stream. A capture's
  // caller calls this once the graph is launched, or when the capture fails.
  void restart_events(size_t first);

 private:
  cudaStream_t stream_;
  void* host_ = nullptr;  // pinned, kSlots × kSlotBytes
  std::vector<cudaEvent_t> events_;
  size_t next_slot_ = 0;
};

}  // namespace dflash::cuda
