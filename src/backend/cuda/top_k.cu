// Top-k sampling's survivors on the device (Backend::top_k_rows; the rule is select_top_k in
// backend.h): one block per row finds the k-th largest scaled logit exactly by a radix select on
// order-preserving 32-bit keys (four passes of 8 bits, each a shared-memory histogram of the
// keys that match the digits found so far), then writes every survivor in ascending id order.
// A sampled step then moves about k values a row to the host instead of a vocabulary of them.
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 1024;

// Larger float, larger key; NaN lowest of all (0: it never survives), −0 as +0 (they compare equal).
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v != v) return 0u;
  if (v == 0.f) v = 0.f;
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// out[row]: [count, ids[cap], scaled[cap] as f32 bits].
__global__ void __launch_bounds__(kThreads)
    top_k_kernel(const float* __restrict__ x, int64_t ldx, int n, int k, float inv_t, int cap, int32_t* out) {
  grid_dependency_begin();
  const float* xr = x + int64_t(blockIdx.x) * ldx;
  int32_t* o = out + int64_t(blockIdx.x) * (1 + 2 * int64_t(cap));
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ int s_rank;
  __shared__ int warp_total[kThreads / 32];
  uint32_t prefix = 0, mask = 0;
  int rank = k;  // the wanted key's rank from the top among keys matching prefix
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) hist[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const uint32_t key = order_key(xr[i] * inv_t);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, d = 255;
      for (; d > 0 && above + int(hist[d]) < rank; --d) above += int(hist[d]);
      s_prefix = prefix | (uint32_t(d) << shift);
      s_rank = rank - above;
    }
    __syncthreads();
    prefix = s_prefix;
    rank = s_rank;
    mask |= 255u << shift;
  }
  const uint32_t kth = prefix;  // the k-th largest key; 0 only when it is NaN: nothing survives

  // Survivors in id order: thread t takes ids [t·C, (t + 1)·C), counts, a block scan gives
  // each thread its first slot.
  const int C = (n + kThreads - 1) / kThreads;
  const int i0 = min(n, int(threadIdx.x) * C), i1 = min(n, i0 + C);
  int mine = 0;
  for (int i = i0; i < i1; ++i) mine += kth != 0u && order_key(xr[i] * inv_t) >= kth;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int incl = mine;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += y;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int w = warp_total[lane];
    int sum = w;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int y = __shfl_up_sync(0xffffffffu, sum, d);
      if (lane >= d) sum += y;
    }
    warp_total[lane] = sum - w;  // exclusive
    if (lane == 31) o[0] = sum;
  }
  __syncthreads();
  int slot = warp_total[warp] + incl - mine;
  for (int i = i0; i < i1 && slot < cap; ++i) {
    const float v = xr[i] * inv_t;
    if (kth != 0u && order_key(v) >= kth) {
      o[1 + slot] = i;
      o[1 + cap + slot] = __float_as_int(v);
      ++slot;
    }
  }
}

}  // namespace

void top_k_rows(const float* x, int64_t ldx, int64_t rows, int64_t n, int k, float inv_t, int cap, int32_t* out,
                cudaStream_t s) {
  if (rows == 0) return;
  launch_kernel("top_k", top_k_kernel, static_cast<unsigned>(rows), kThreads, 0, s, x, ldx, static_cast<int>(n), k,
                inv_t, cap, out);
}

}  // namespace dflash::cuda
