// Sampling's candidates on the device, so that a sampled step moves a few values a row to the
// host instead of a vocabulary of them. One block of 1024 threads a row.
// - Top-k (Backend::top_k_rows; the rule is select_top_k in backend.h): the k-th largest scaled
//   logit exactly, by a radix select on order-preserving 32-bit keys (four passes of 8 bits,
//   each a shared-memory histogram of the keys that match the digits found so far).
// - Top-p (Backend::top_p_rows; the rule is select_top_p): the row's max, its mass
//   Σ exp(scaled − max) and a histogram of that mass over buckets of distance from the max, then
//   the fewest leading buckets whose complement holds at most the budget.
// Both then write their candidates in ascending id order.
#include "backend/backend.h"
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

// Every i with keep(x[i] · inv_t), in ascending id order: thread t takes ids [t·C, (t + 1)·C),
// counts, and a block scan gives each thread its first slot. *count gets the total; past cap
// they are counted, not stored.
template <typename Keep>
__device__ void write_in_id_order(const float* __restrict__ xr, int n, float inv_t, Keep keep, int cap, int32_t* count,
                                  int32_t* ids, int32_t* scaled) {
  __shared__ int warp_total[kThreads / 32];
  const int C = (n + kThreads - 1) / kThreads;
  const int i0 = min(n, int(threadIdx.x) * C), i1 = min(n, i0 + C);
  int mine = 0;
  for (int i = i0; i < i1; ++i) mine += keep(xr[i] * inv_t);
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
    if (lane == 31) *count = sum;
  }
  __syncthreads();
  int slot = warp_total[warp] + incl - mine;
  for (int i = i0; i < i1 && slot < cap; ++i) {
    const float v = xr[i] * inv_t;
    if (keep(v)) {
      ids[slot] = i;
      scaled[slot] = __float_as_int(v);
      ++slot;
    }
  }
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

  write_in_id_order(xr, n, inv_t, [kth](float v) { return kth != 0u && order_key(v) >= kth; }, cap, o, o + 1,
                    o + 1 + cap);
}


// The bucket of a scaled value (select_top_p): the same f32 arithmetic as the host's; the
// multiplication by a power of two is exact.
__device__ __forceinline__ int top_p_bucket(float s, float mx) {
  const float d = (mx - s) * kTopPBucketsPerUnit;
  return d < float(kTopPBuckets - 1) ? static_cast<int>(d) : kTopPBuckets - 1;
}

// out[row]: [count, row mass as f32 bits, ids[cap], scaled[cap] as f32 bits]. The mass is
// summed in a fixed order (each thread its strided elements, then block_sum), so a row gives the
// same bits every run; the buckets hold fixed-point mass rounded up, integer adds in any order
// giving the same sums. A token under one unit (2^-32 of the max's weight: most of a peaked
// row, whose atomics on one far bucket took 4.7 ms for 16 rows) counts one unit in the last
// bucket instead. Both only overstate what lies below a cut, so only ever keep more candidates.
__global__ void __launch_bounds__(kThreads)
    top_p_kernel(const float* __restrict__ x, int64_t ldx, int n, float inv_t, float top_p, int cap, int32_t* out) {
  grid_dependency_begin();
  const float* xr = x + int64_t(blockIdx.x) * ldx;
  int32_t* o = out + int64_t(blockIdx.x) * (2 + 2 * int64_t(cap));
  constexpr double kFixed = 4294967296.0;  // 2^32: a bucket's mass in units of 2^-32
  __shared__ unsigned long long bucket[kTopPBuckets];
  __shared__ float partial[32];
  __shared__ float s_max;
  __shared__ int s_last;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < n; i += kThreads) mx = fmaxf(mx, xr[i] * inv_t);  // fmaxf skips NaN
  mx = warp_max(mx);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = mx;
  for (int i = threadIdx.x; i < kTopPBuckets; i += kThreads) bucket[i] = 0ull;
  __syncthreads();
  if (threadIdx.x < 32) {
    const float m = warp_max(partial[threadIdx.x]);
    if (threadIdx.x == 0) {
      s_max = m;
      s_last = 0;
    }
  }
  __syncthreads();
  mx = s_max;
  float mass = 0.f;
  unsigned long long faint = 0;  // tokens under one fixed-point unit
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float s = xr[i] * inv_t;
    if (s != s) continue;
    const float e = expf(s - mx);
    mass += e;
    const double f = double(e) * kFixed;
    if (f < 1.0) ++faint;
    else atomicAdd(&bucket[top_p_bucket(s, mx)], static_cast<unsigned long long>(ceil(f)));
  }
  if (faint) atomicAdd(&bucket[kTopPBuckets - 1], faint);
  mass = block_sum(mass, partial);  // ends past a barrier: the buckets are complete
  // The last candidate bucket: the largest b whose mass at or beyond it exceeds the budget.
  // Warp 0, lane l owning buckets [64·l, 64·l + 64), suffix sums across lanes by shuffles.
  if (threadIdx.x < 32) {
    const unsigned long long budget =
        static_cast<unsigned long long>((1.0 - double(top_p)) * (1.0 - 1e-3) * double(mass) * kFixed);
    constexpr int kPer = kTopPBuckets / 32;
    const int lane = threadIdx.x;
    unsigned long long own = 0;
    for (int b = 0; b < kPer; ++b) own += bucket[lane * kPer + b];
    unsigned long long beyond = own;  // lanes ≥ this one
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const unsigned long long y = __shfl_down_sync(0xffffffffu, beyond, d);
      if (lane + d < 32) beyond += y;
    }
    unsigned long long suffix = beyond - own;  // lanes after this one
    int last = -1;
    for (int b = kPer - 1; b >= 0; --b) {
      suffix += bucket[lane * kPer + b];
      if (suffix > budget) {
        last = lane * kPer + b;
        break;
      }
    }
    for (int d = 16; d > 0; d >>= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, d));
    if (lane == 0) {
      s_last = max(last, 0);
      o[1] = __float_as_int(mass);
    }
  }
  __syncthreads();
  const int last = s_last;
  write_in_id_order(xr, n, inv_t, [mx, last](float v) { return v == v && top_p_bucket(v, mx) <= last; }, cap, o,
                    o + 2, o + 2 + cap);
}

}  // namespace

void top_k_rows(const float* x, int64_t ldx, int64_t rows, int64_t n, int k, float inv_t, int cap, int32_t* out,
                cudaStream_t s) {
  if (rows == 0) return;
  launch_kernel("top_k", top_k_kernel, static_cast<unsigned>(rows), kThreads, 0, s, x, ldx, static_cast<int>(n), k,
                inv_t, cap, out);
}

void top_p_rows(const float* x, int64_t ldx, int64_t rows, int64_t n, float inv_t, float top_p, int cap, int32_t* out,
                cudaStream_t s) {
  if (rows == 0) return;
  launch_kernel("top_p", top_p_kernel, static_cast<unsigned>(rows), kThreads, 0, s, x, ldx, static_cast<int>(n), inv_t,
                top_p, cap, out);
}

}  // namespace dflash::cuda
