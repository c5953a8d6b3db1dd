#include "backend/cuda/id_reads.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/kernels.h"

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
  check(cudaHostAlloc(&host_, kSlots * kSlotIds * sizeof(int32_t), cudaHostAllocMapped), "init",
        "allocating pinned read slots");
  check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&host_on_device_), host_, 0), "init",
        "mapping the pinned read slots");
  // DFLASH_READ_IDS_MEMCPY=1 (measuring only): a device-to-host copy, as before 2026-12-03.
  if (const char* e = std::getenv("DFLASH_READ_IDS_MEMCPY"); e && std::string(e) == "1") by_copy_ = true;
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
  // A kernel writes the ids into the slot through its device mapping: on the stream it is one
  // more kernel after the step's last, where a device-to-host copy is a copy node between two
  // kernels (a plain decode step ran about 7 µs later after the copy than a verification after
  // the draft's last kernel, H200 timeline, 2026-12-03). The event below completes once the
  // kernel has, and its writes are then visible to the host.
  if (n && by_copy_)
    check(cudaMemcpyAsync(host_ + slot * kSlotIds, dev, n * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
          "read_ids", "device to host copy");
  else if (n)
    copy_ids(dev, host_on_device_ + slot * kSlotIds, int64_t(n), stream_);
  check(cudaEventRecord(events_[slot], stream_), "read_ids", "cudaEventRecord");
  in_use_[slot] = true;
  return std::make_unique<Pending>(*this, slot, n);
}

}  // namespace dflash::cuda
