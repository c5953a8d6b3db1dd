#pragma once
// Backend::read_ids on the CUDA stream: pinned slots of kSlotIds ids, each with the event of its
// copy, held while the PendingIds that reads it lives. A few suffice: plain decoding holds two
// reads at a time (the step it waits for and the one queued ahead), the speculative loop one.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "backend/backend.h"

namespace dflash::cuda {

class IdReads {
 public:
  static constexpr size_t kSlots = 8, kSlotIds = 256;

  explicit IdReads(cudaStream_t stream);
  ~IdReads();
  IdReads(const IdReads&) = delete;
  IdReads& operator=(const IdReads&) = delete;

  // Starts copying n ids from the device (as they will be once the work queued so far ran).
  std::unique_ptr<PendingIds> read(const int32_t* dev, size_t n);

 private:
  class Pending;
  cudaStream_t stream_;
  int32_t* host_ = nullptr;  // pinned, kSlots × kSlotIds
  cudaEvent_t events_[kSlots] = {};
  bool in_use_[kSlots] = {};
};

}  // namespace dflash::cuda
