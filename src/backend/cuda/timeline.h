#pragma once
// A device-side timeline of the backend's kernels, for measuring only: a build configured with
// -DDFLASH_CUDA_TIMELINE=ON and run with DFLASH_CUDA_TIMELINE_OUT=FILE has thread 0 of every
// block stamp the device's clocks as the block arrives, as its grid dependency wait returns and
// (where a kernel says so) as it leaves; the records go to FILE when the backend ends.
// tools/timeline_report.py reads them. The GPU machine has no Nsight Systems, and the question
// it would answer (where a decode step's time goes between the kernels) is one of microseconds
// between overlapping launches, which events on the host cannot see. In every other build the
// kernels' code is unchanged (device_util.cuh).
#include <cstdint>
#include <memory>
#include <string>

namespace dflash::cuda {

// One block of one launch. Times are %globaltimer (ns, one clock for the device) and %clock64
// (the SM's own cycles, finer, to be aligned per SM against the first).
struct TimelineRecord {
  uint64_t grid;                       // %gridid: repeats when a CUDA graph is replayed
  uint64_t t_entry, t_wait, t_exit;    // globaltimer: arrival, wait returned, exit (0: not stamped)
  uint64_t c_entry, c_wait, c_exit;    // clock64, the same three points
  uint32_t sm, block, grid_blocks, threads;
  uint32_t n, k, m;                    // the products' shape (0 for other kernels)
  uint32_t pad;                        // 0: keeps the record a multiple of 8 bytes
};
static_assert(sizeof(TimelineRecord) == 88);

struct TimelineRing {
  unsigned long long next;      // records claimed so far (may pass capacity: those are dropped)
  unsigned long long capacity;
  TimelineRecord* records;
};

// Each CUDA translation unit holds its own copy of the device pointer to the ring (no
// relocatable device code in this build), so each registers a setter at static initialisation.
using TimelineSetter = void (*)(TimelineRing*);
bool register_timeline_setter(TimelineSetter setter);

class Timeline {
 public:
  // Null unless DFLASH_CUDA_TIMELINE_OUT is set (a build without the timeline then says so).
  static std::unique_ptr<Timeline> from_env();
  Timeline(std::string path, uint64_t capacity);
  ~Timeline();  // writes the file
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

 private:
  std::string path_;
  uint64_t capacity_;
  TimelineRing* ring_ = nullptr;      // device
  TimelineRecord* records_ = nullptr; // device
};

}  // namespace dflash::cuda
