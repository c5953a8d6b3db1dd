#pragma once
// A caching device allocator: a forward pass allocates its activations afresh (the model code
// asks the backend for scratch every call), and cudaMalloc/cudaFree synchronise the device,
// so freed blocks are kept and handed out again. One stream uses every block, so a block
// returned while kernels that read it are still queued is safe to reuse: whatever uses it
// next is queued behind them.
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

namespace dflash::cuda {

class DevicePool : public std::enable_shared_from_this<DevicePool> {
 public:
  ~DevicePool();
  // A block of at least `bytes`, 256-byte aligned, owned by the returned pointer: dropping the
  // last reference puts it back in the pool (which the deleter keeps alive).
  std::shared_ptr<void> allocate(size_t bytes, const char* op);
  // A block no queued kernel can be using (new from the driver), for a write that is not
  // ordered on the stream (the RoPE tables' upload); it joins the pool when dropped.
  std::shared_ptr<void> allocate_fresh(size_t bytes, const char* op);
  // Gives every cached block back to the driver (used when cudaMalloc fails).
  void release_cached();

  size_t cached_bytes() const { return cached_; }
  size_t live_bytes() const { return live_; }
  size_t peak_bytes() const { return peak_; }

 private:
  void put(void* p, size_t bytes);
  std::shared_ptr<void> take(void* p, size_t bytes);
  void* malloc_block(size_t size, const char* op);

  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  size_t cached_ = 0, live_ = 0, peak_ = 0;
};

}  // namespace dflash::cuda
