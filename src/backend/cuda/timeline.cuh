#pragma once
// The kernels' side of timeline.h. grid_dependency_begin() (device_util.cuh) returns a
// TimelineMark; a kernel that wants its exit or its shape on the timeline keeps the mark and
// calls exit() / shape() on it. Without DFLASH_CUDA_TIMELINE the mark is empty and its calls
// compile to nothing, so the kernels of a normal build are untouched.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/timeline.h"

namespace dflash::cuda {

#ifdef DFLASH_CUDA_TIMELINE
namespace timeline_detail {
// One copy per translation unit (timeline.h says why), set through the registered setter.
static __device__ TimelineRing* g_ring = nullptr;
static void set_ring(TimelineRing* ring) { (void)cudaMemcpyToSymbol(g_ring, &ring, sizeof ring); }
[[maybe_unused]] static const bool g_registered = register_timeline_setter(&set_ring);

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint64_t sm_clock() {
  uint64_t c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
  return c;
}
}  // namespace timeline_detail

struct TimelineMark {
  TimelineRecord* rec = nullptr;
  __device__ void shape(int n, int k, int m) const {
    if (rec) {
      rec->n = n;
      rec->k = k;
      rec->m = m;
    }
  }
  __device__ void exit() const {
    if (rec) {
      rec->t_exit = timeline_detail::global_ns();
      rec->c_exit = timeline_detail::sm_clock();
    }
  }
};

struct TimelineArrival {
  uint64_t t = 0, c = 0;
};
__device__ __forceinline__ TimelineArrival timeline_arrive() {
  TimelineArrival a;
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    a.t = timeline_detail::global_ns();
    a.c = timeline_detail::sm_clock();
  }
  return a;
}
// Thread 0 of the block claims a record once the wait has returned.
__device__ __forceinline__ TimelineMark timeline_waited(const TimelineArrival& a) {
  TimelineMark mark;
  if (threadIdx.x != 0 || threadIdx.y != 0 || threadIdx.z != 0) return mark;
  const uint64_t t = timeline_detail::global_ns(), c = timeline_detail::sm_clock();
  TimelineRing* ring = timeline_detail::g_ring;
  if (!ring) return mark;
  const unsigned long long i = atomicAdd(&ring->next, 1ull);
  if (i >= ring->capacity) return mark;
  TimelineRecord* r = ring->records + i;
  uint64_t grid;
  unsigned sm;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  r->grid = grid;
  r->t_entry = a.t;
  r->t_wait = t;
  r->t_exit = 0;
  r->c_entry = a.c;
  r->c_wait = c;
  r->c_exit = 0;
  r->sm = sm;
  r->block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  r->grid_blocks = gridDim.x * gridDim.y * gridDim.z;
  r->threads = blockDim.x * blockDim.y * blockDim.z;
  r->n = r->k = r->m = r->pad = 0;
  mark.rec = r;
  return mark;
}
#else
struct TimelineMark {
  __device__ void shape(int, int, int) const {}
  __device__ void exit() const {}
};
struct TimelineArrival {};
__device__ __forceinline__ TimelineArrival timeline_arrive() { return {}; }
__device__ __forceinline__ TimelineMark timeline_waited(const TimelineArrival&) { return {}; }
#endif

}  // namespace dflash::cuda
