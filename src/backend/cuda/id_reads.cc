#include "backend/cuda/id_reads.h"

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/cuda_common.h"

namespace dflash::cuda {

// Ids copied into a pinned slot; get() waits for the copy's event.
class IdReads::Pending final : public PendingIds {
 public:
  Pending(IdReads& r, size_t slot, size_t n) : r_(r), slot_(slot), n_(n) {}
  ~Pending() override { r_.in_use_[slot_] = false; }
  std::vector<int32_t> get() override {
    check(cudaEventSynchronize(r_.events_[slot_]), "read_ids", "waiting for the ids");
    const int32_t* p = r_.host_ + slot_ * kSlotIds;
    return std::vector<int32_t>(p, p + n_);
  }

 private:
  IdReads& r_;
  size_t slot_, n_;
};

IdReads::IdReads(cudaStream_t stream) : stream_(stream) {
  check(cudaHostAlloc(&host_, kSlots * kSlotIds * sizeof(int32_t), cudaHostAllocDefault), "init",
        "allocating pinned read slots");
  for (auto& e : events_) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "init", "cudaEventCreate");
}

IdReads::~IdReads() {
  for (auto e : events_)
    if (e) cudaEventDestroy(e);
  cudaFreeHost(host_);
}

std::unique_ptr<PendingIds> IdReads::read(const int32_t* dev, size_t n) {
  size_t slot = 0;
  while (slot < kSlots && in_use_[slot]) ++slot;
  if (slot == kSlots || n > kSlotIds)
    throw Error("cuda read_ids: " + std::to_string(n) + " ids with " +
                std::to_string(std::count(in_use_, in_use_ + kSlots, true)) + " of " + std::to_string(kSlots) +
                " read slots held (at most " + std::to_string(kSlotIds) + " ids a slot)");
  int32_t* host = host_ + slot * kSlotIds;
  if (n) check(cudaMemcpyAsync(host, dev, n * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_), "read_ids",
               "device to host copy");
  check(cudaEventRecord(events_[slot], stream_), "read_ids", "cudaEventRecord");
  in_use_[slot] = true;
  return std::make_unique<Pending>(*this, slot, n);
}

}  // namespace dflash::cuda
