// Sampling's candidates on the device, so that a sampled step moves a few values a row to the
// host instead of a vocabulary of them.
// - Top-k (Backend::top_k_rows; the rule is select_top_k in backend.h): the k-th largest scaled
//   logit exactly, by a radix select on order-preserving 32-bit keys (four passes of 8 bits,
//   each a shared-memory histogram of the keys that match the digits found so far). One block a
//   row read a 152k-entry row at the pace of one SM (16 rows: 160 µs on an H200; 27 µs cut), so
//   a long row is cut into contiguous slices, a block each, and each slice keeps its own
//   survivors (key ≥ the slice's k-th largest; every non-NaN value where that is NaN, as when
//   the slice is shorter than k) in id order in scratch; then one block a row selects over the
//   union of its slices' survivors. A value at or above the row's k-th largest has fewer than k
//   values above it in its slice, so it survives its slice: the union holds all of the row's
//   survivors and so its k-th largest is the row's (when it holds fewer than k values, the
//   row's is NaN and nothing survives), and walking the slices in order keeps the ids
//   ascending. A slice with more survivors than its scratch holds (ties, -inf) sends its row to
//   the one-block select over the whole row, as does a row too short to cut: the count stays
//   exact, as the doctor's comparison with ties needs.
// - Top-p (Backend::top_p_rows; the rule is select_top_p): the row's max, its mass
//   Σ exp(scaled − max) and a histogram of that mass over buckets of distance from the max, then
//   the fewest leading buckets whose complement holds at most the budget.
// Both then write their candidates in ascending id order.
#include <algorithm>

#include "backend/backend.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kMaxSlices = 64;          // a row's slices at most (warp 0 scans their counts, two a lane)
constexpr int kTargetBlocks = 256;      // slice blocks of all rows: about two on each SM of an H200
constexpr int64_t kMinSlice = 4096;     // a slice's length at least, and 8·k: k is a small part of it
constexpr int64_t kMinSliceCap = 1024;  // survivors a slice's scratch holds at least, for ties

// Larger float, larger key; NaN lowest of all (0: it never survives), −0 as +0 (they compare equal).
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v != v) return 0u;
  if (v == 0.f) v = 0.f;
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

constexpr int kUnroll = 4;  // loads a thread issues before using them, on a row's passes

// f(x[i]) for this thread's i = threadIdx.x + j·kThreads < n, in order of i.
template <typename F>
__device__ __forceinline__ void for_each_strided(const float* __restrict__ x, int n, F f) {
  int i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < n; i += kUnroll * kThreads) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = x[i + u * kThreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) f(v[u]);
  }
  for (; i < n; i += kThreads) f(x[i]);
}

// Positions [j0, j1) of a row or slice xs whose first id is id0: f(id, scaled) for each in
// order, until f returns false.
struct RowWalk {
  const float* xs;
  int id0;
  float inv_t;
  template <typename F>
  __device__ void operator()(int j0, int j1, F f) const {
    int j = j0;
    for (; j + kUnroll <= j1; j += kUnroll) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = xs[j + u];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (!f(id0 + j + u, v[u] * inv_t)) return;
    }
    for (; j < j1; ++j)
      if (!f(id0 + j, xs[j] * inv_t)) return;
  }
};

// Every kept one of n positions, in order: thread t takes positions [t·C, (t + 1)·C), which
// walk(j0, j1, f) hands to f as (id, scaled), counts, and a block scan gives each thread its
// first slot, from `base` on (a slice's place in its row). *count (where given) gets the
// total; past cap they are counted, not stored.
template <typename Walk, typename Keep>
__device__ void write_in_order(int n, Walk walk, Keep keep, int cap, int32_t* count, int32_t* ids, int32_t* scaled,
                               int base = 0) {
  __shared__ int warp_total[kThreads / 32];
  const int C = (n + kThreads - 1) / kThreads;
  const int i0 = min(n, int(threadIdx.x) * C), i1 = min(n, i0 + C);
  int mine = 0;
  walk(i0, i1, [&](int, float v) {
    mine += keep(v);
    return true;
  });
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int incl = warp_inclusive_sum(mine);
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int w = warp_total[lane];
    int sum = warp_inclusive_sum(w);
    warp_total[lane] = sum - w;  // exclusive
    if (lane == 31 && count) *count = sum;
  }
  __syncthreads();
  int slot = base + warp_total[warp] + incl - mine;
  walk(i0, i1, [&](int id, float v) {
    if (slot >= cap) return false;
    if (keep(v)) {
      ids[slot] = id;
      scaled[slot] = __float_as_int(v);
      ++slot;
    }
    return true;
  });
}

// Every i of row xr with keep(x[i] · inv_t), in ascending id order.
template <typename Keep>
__device__ void write_in_id_order(const float* __restrict__ xr, int n, float inv_t, Keep keep, int cap, int32_t* count,
                                  int32_t* ids, int32_t* scaled) {
  write_in_order(n, RowWalk{xr, 0, inv_t}, keep, cap, count, ids, scaled);
}

// The rank-th largest (counting repeats) of the keys key_at(j), j < m; 1 ≤ rank ≤ m.
template <typename KeyAt>
__device__ uint32_t radix_select(int m, KeyAt key_at, int rank) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ int s_rank;
  uint32_t prefix = 0, mask = 0;  // the digits found so far; rank: the wanted key's among keys matching them
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) hist[i] = 0;
    __syncthreads();
#pragma unroll 4
    for (int j = threadIdx.x; j < m; j += kThreads) {
      const uint32_t key = key_at(j);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    // The digit that holds it: lane l of warp 0 owns digits [8l, 8l + 8), sums of the lanes at
    // and above each give the one lane where the count from the top reaches rank, and that lane
    // walks its digits down. (Thread 0 walking all 256 was a serial chain of shared loads.)
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      int own = 0;
      for (int b = 0; b < 8; ++b) own += int(hist[8 * lane + b]);
      int from = own;  // keys in digits ≥ 8·lane
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int y = __shfl_down_sync(0xffffffffu, from, d);
        if (lane + d < 32) from += y;
      }
      int above = from - own;
      if (above < rank && rank <= from) {
        int d = 8 * lane + 7;
        for (; above + int(hist[d]) < rank; --d) above += int(hist[d]);
        s_prefix = prefix | (uint32_t(d) << shift);
        s_rank = rank - above;
      }
    }
    __syncthreads();
    prefix = s_prefix;
    rank = s_rank;
    mask |= 255u << shift;
  }
  return prefix;
}

// Block (s, row): the survivors of the row's slice s (ids [s·slice, (s + 1)·slice)) as if it
// were the row, with rank min(k, its length), and every non-NaN one where that key is NaN,
// into part's [count, ids[scap], scaled[scap]] for (row, s).
__global__ void __launch_bounds__(kThreads)
    top_k_slices_kernel(const float* __restrict__ x, int64_t ldx, int n, int slice, int k, float inv_t, int scap,
                        int32_t* __restrict__ part) {
  grid_dependency_begin();
  const int id0 = int(blockIdx.x) * slice, len = min(slice, n - id0);
  const float* xs = x + int64_t(blockIdx.y) * ldx + id0;
  int32_t* p = part + (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * (1 + 2 * int64_t(scap));
  const uint32_t kth = radix_select(len, [&](int i) { return order_key(xs[i] * inv_t); }, min(k, len));
  const uint32_t least = max(kth, 1u);  // NaN never survives
  write_in_order(len, RowWalk{xs, id0, inv_t}, [least](float v) { return order_key(v) >= least; }, scap, p, p + 1,
                 p + 1 + scap);
}

// out[row]: [count, ids[cap], scaled[cap] as f32 bits], from the row's `slices` survivor lists
// in part (top_k_slices_kernel), or from the whole row where slices is 0 or one list overflowed.
__global__ void __launch_bounds__(kThreads)
    top_k_kernel(const float* __restrict__ x, int64_t ldx, int n, int k, float inv_t, int cap, int32_t* out,
                 const int32_t* __restrict__ part, int slices, int scap) {
  grid_dependency_begin();
  const float* xr = x + int64_t(blockIdx.x) * ldx;
  int32_t* o = out + int64_t(blockIdx.x) * (1 + 2 * int64_t(cap));
  const int64_t per = 1 + 2 * int64_t(scap);
  const int32_t* p = part + int64_t(blockIdx.x) * slices * per;
  __shared__ int start[kMaxSlices + 1];  // slice s's survivors: positions [start[s], start[s + 1]) of the union
  __shared__ bool s_overflow;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, s = 2 * lane;
    const int a = s < slices ? p[s * per] : 0, b = s + 1 < slices ? p[(s + 1) * per] : 0;
    int incl = warp_inclusive_sum(a + b);
    start[s] = incl - a - b;
    start[s + 1] = incl - b;
    if (lane == 31) start[kMaxSlices] = incl;
    const bool over = __any_sync(0xffffffffu, a > scap || b > scap);
    if (lane == 0) s_overflow = over;
  }
  __syncthreads();
  if (slices == 0 || s_overflow) {
    // 0 only when it is NaN: nothing survives
    const uint32_t kth = radix_select(n, [&](int i) { return order_key(xr[i] * inv_t); }, k);
    write_in_id_order(xr, n, inv_t, [kth](float v) { return kth != 0u && order_key(v) >= kth; }, cap, o, o + 1,
                      o + 1 + cap);
    return;
  }
  // Position j of the union: slice s, the last with start[s] ≤ j, entry j − start[s]. (A loop
  // over the slices was a chain of dependent loads, one a slice.)
  const int total = start[kMaxSlices];
  auto entry = [&](int j) {
    int s = 0;
    for (int w = kMaxSlices / 2; w > 0; w /= 2)
      if (start[s + w] <= j) s += w;
    return p + s * per + 1 + (j - start[s]);  // its id; its scaled value scap further
  };
  // Fewer than k in the union: fewer than k non-NaN values in the row, nothing survives.
  const uint32_t kth =
      total < k ? 0u : radix_select(total, [&](int j) { return order_key(__int_as_float(entry(j)[scap])); }, k);
  write_in_order(
      total,
      [&](int j0, int j1, auto f) {
        for (int j = j0; j < j1; ++j) {
          const int32_t* q = entry(j);
          if (!f(q[0], __int_as_float(q[scap]))) return;
        }
      },
      [kth](float v) { return kth != 0u && order_key(v) >= kth; }, cap, o, o + 1, o + 1 + cap);
}

// How top_k_rows cuts a row: slices of at least kMinSlice and 8·k values, as many as give about
// kTargetBlocks blocks in all, none empty; no slices (0) where that leaves one. scap: the
// survivors each slice's scratch holds.
struct Split {
  int slices = 0, slice = 0, scap = 0;
};
Split split_for(int64_t rows, int64_t n, int64_t k, int cap) {
  k = std::min(k, n);
  const int64_t by_blocks = (kTargetBlocks + rows - 1) / rows, by_length = n / std::max(kMinSlice, 8 * k);
  const int64_t want = std::min({by_blocks, by_length, int64_t(kMaxSlices)});
  if (want < 2 || rows > 65535) return {};
  const int64_t slice = (n + want - 1) / want;
  const int64_t scap = std::min(slice, std::max({int64_t(cap), 2 * k, kMinSliceCap}));
  return {static_cast<int>((n + slice - 1) / slice), static_cast<int>(slice), static_cast<int>(scap)};
}

// The bucket of a scaled value (select_top_p): the same f32 arithmetic as the host's; the
// multiplication by a power of two is exact.
__device__ __forceinline__ int top_p_bucket(float s, float mx) {
  const float d = (mx - s) * kTopPBucketsPerUnit;
  return d < float(kTopPBuckets - 1) ? static_cast<int>(d) : kTopPBuckets - 1;
}

constexpr double kFixed = 4294967296.0;  // 2^32: a bucket's mass in units of 2^-32 of the max's weight

// Token s's weight exp(s − mx), its fixed-point mass rounded up added to its bucket, or, under one
// unit, counted faint (a peaked row's tail, whose atomics on one far bucket took 4.7 ms for 16
// rows); the caller adds the faint count to the last bucket. Both only overstate what lies below
// a cut, so only ever keep more candidates.
__device__ __forceinline__ float tally(float s, float mx, unsigned long long* bucket, unsigned long long& faint) {
  const float e = expf(s - mx);
  const float f = e * float(kFixed);  // exact: a power of two
  if (f < 1.f) ++faint;
  else atomicAdd(&bucket[top_p_bucket(s, mx)], static_cast<unsigned long long>(ceilf(f)));
  return e;
}

// Warp 0 only: the last candidate bucket, the largest b whose mass at or beyond it exceeds
// (1 − top_p)(1 − 1e-3) of the row's mass (0 where none does), on every lane. Lane l owns
// buckets [64·l, 64·l + 64), suffix sums across lanes by shuffles.
__device__ int last_bucket(const unsigned long long* bucket, float mass, float top_p) {
  const unsigned long long budget =
      static_cast<unsigned long long>((1.0 - double(top_p)) * (1.0 - 1e-3) * double(mass) * kFixed);
  constexpr int kPer = kTopPBuckets / 32;
  const int lane = threadIdx.x;
  unsigned long long own = 0;
#pragma unroll 4  // whole, the 64 loads went to the stack
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
  return max(last, 0);
}

// The block's tokens xs[0 … len) against the row's max: the histogram in `bucket` (zeroed and
// barriered by the caller) and the mass Σ exp(scaled − mx), each thread its strided tokens,
// then block_sum, which ends past a barrier, so the buckets are complete on return.
__device__ float mass_and_histogram(const float* __restrict__ xs, int len, float inv_t, float mx,
                                    unsigned long long* bucket, float* partial) {
  float mass = 0.f;
  unsigned long long faint = 0;
  for_each_strided(xs, len, [&](float v) {
    const float s = v * inv_t;
    if (s == s) mass += tally(s, mx, bucket, faint);
  });
  if (faint) atomicAdd(&bucket[kTopPBuckets - 1], faint);
  return block_sum(mass, partial);
}

// out[row]: [count, row mass as f32 bits, ids[cap], scaled[cap] as f32 bits], one block a row
// (rows too short to cut). The mass is summed in a fixed order (each thread its strided
// elements, then block_sum), so a row gives the same bits every run; the buckets hold
// fixed-point mass rounded up, integer adds in any order giving the same sums.
__global__ void __launch_bounds__(kThreads)
    top_p_kernel(const float* __restrict__ x, int64_t ldx, int n, float inv_t, float top_p, int cap, int32_t* out) {
  grid_dependency_begin();
  const float* xr = x + int64_t(blockIdx.x) * ldx;
  int32_t* o = out + int64_t(blockIdx.x) * (2 + 2 * int64_t(cap));
  __shared__ unsigned long long bucket[kTopPBuckets];
  __shared__ float partial[32];
  __shared__ float s_max;
  __shared__ int s_last;
  // The row's passes load kUnroll values a thread before using them: one block reads the row,
  // so the loads in flight per thread set its pace (292 µs for 16 rows one at a time).
  float mx = -INFINITY;
  for_each_strided(xr, n, [&](float v) { mx = fmaxf(mx, v * inv_t); });  // fmaxf skips NaN
  mx = warp_max(mx);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = mx;
  for (int i = threadIdx.x; i < kTopPBuckets; i += kThreads) bucket[i] = 0ull;
  __syncthreads();
  if (threadIdx.x < 32) {
    const float m = warp_max(partial[threadIdx.x]);
    if (threadIdx.x == 0) s_max = m;
  }
  __syncthreads();
  mx = s_max;
  const float mass = mass_and_histogram(xr, n, inv_t, mx, bucket, partial);
  if (threadIdx.x < 32) {
    const int last = last_bucket(bucket, mass, top_p);
    if (threadIdx.x == 0) {
      s_last = last;
      o[1] = __float_as_int(mass);
    }
  }
  __syncthreads();
  const int last = s_last;
  write_in_id_order(xr, n, inv_t, [mx, last](float v) { return v == v && top_p_bucket(v, mx) <= last; }, cap, o,
                    o + 2, o + 2 + cap);
}

// The same for rows long enough to cut: slices of `slice` ids, a block each (grid: slices ×
// rows), in five launches: the slices' maxima; the row's max, each slice's mass and histogram
// (added into the row's histogram with integer atomics: the same sums in any order); one warp a
// row summing the masses in slice order and choosing the last bucket; the slices' candidate
// counts; and each slice writing its candidates from its place in the row. Scratch (TopPScratch):
// the row histograms, then per (row, slice) max, mass and count, then per row the last bucket.
struct TopPScratch {
  unsigned long long* hist;  // [rows][kTopPBuckets]
  float *max, *mass;         // [rows][slices]
  int *count, *last;         // [rows][slices], [rows]
  TopPScratch(void* p, int64_t rows, int slices) {
    hist = static_cast<unsigned long long*>(p);
    max = reinterpret_cast<float*>(hist + rows * kTopPBuckets);
    mass = max + rows * slices;
    count = reinterpret_cast<int*>(mass + rows * slices);
    last = count + rows * slices;
  }
  static size_t bytes(int64_t rows, int slices) {
    return size_t(rows) * (kTopPBuckets * sizeof(unsigned long long) + slices * 3 * sizeof(float) + sizeof(int));
  }
};

// The row's max from its slices' (every thread the same, in slice order; the max is exact).
__device__ __forceinline__ float row_max(const float* slice_max, int slices) {
  float m = -INFINITY;
  for (int s = 0; s < slices; ++s) m = fmaxf(m, slice_max[s]);
  return m;
}

__global__ void __launch_bounds__(kThreads)
    top_p_max_kernel(const float* __restrict__ x, int64_t ldx, int n, int slice, float inv_t, TopPScratch sc) {
  grid_dependency_begin();
  const int id0 = int(blockIdx.x) * slice, len = min(slice, n - id0);
  const float* xs = x + int64_t(blockIdx.y) * ldx + id0;
  __shared__ float partial[32];
  float mx = -INFINITY;
  for_each_strided(xs, len, [&](float v) { mx = fmaxf(mx, v * inv_t); });
  mx = warp_max(mx);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = mx;
  // The next launch adds into the row's histogram: zero it here, a share a slice.
  for (int b = int(blockIdx.x) * kThreads + threadIdx.x; b < kTopPBuckets; b += int(gridDim.x) * kThreads)
    sc.hist[int64_t(blockIdx.y) * kTopPBuckets + b] = 0ull;
  __syncthreads();
  if (threadIdx.x < 32) {
    const float m = warp_max(partial[threadIdx.x]);
    if (threadIdx.x == 0) sc.max[int64_t(blockIdx.y) * gridDim.x + blockIdx.x] = m;
  }
}

__global__ void __launch_bounds__(kThreads)
    top_p_hist_kernel(const float* __restrict__ x, int64_t ldx, int n, int slice, float inv_t, TopPScratch sc) {
  grid_dependency_begin();
  const int id0 = int(blockIdx.x) * slice, len = min(slice, n - id0);
  const float* xs = x + int64_t(blockIdx.y) * ldx + id0;
  const int64_t rs = int64_t(blockIdx.y) * gridDim.x;  // the row's first (row, slice) entry
  __shared__ unsigned long long bucket[kTopPBuckets];
  __shared__ float partial[32];
  for (int i = threadIdx.x; i < kTopPBuckets; i += kThreads) bucket[i] = 0ull;
  const float mx = row_max(sc.max + rs, gridDim.x);
  __syncthreads();
  const float mass = mass_and_histogram(xs, len, inv_t, mx, bucket, partial);
  if (threadIdx.x == 0) sc.mass[rs + blockIdx.x] = mass;
  unsigned long long* hist = sc.hist + int64_t(blockIdx.y) * kTopPBuckets;
  for (int b = threadIdx.x; b < kTopPBuckets; b += kThreads)
    if (bucket[b]) atomicAdd(&hist[b], bucket[b]);
}

// One warp a row: the mass (slices in order) into the row's header, and the last bucket.
__global__ void top_p_cut_kernel(TopPScratch sc, int slices, float top_p, int cap, int32_t* out) {
  grid_dependency_begin();
  const int64_t r = blockIdx.x;
  const float* m = sc.mass + r * slices;
  float mass = 0.f;
  for (int s = 0; s < slices; ++s) mass += m[s];  // every lane the same sum
  const int last = last_bucket(sc.hist + r * kTopPBuckets, mass, top_p);
  if (threadIdx.x == 0) {
    sc.last[r] = last;
    out[r * (2 + 2 * int64_t(cap)) + 1] = __float_as_int(mass);
  }
}

// keep() of top-p: within the last candidate bucket of the row's max.
struct TopPKeep {
  float mx;
  int last;
  __device__ bool operator()(float v) const { return v == v && top_p_bucket(v, mx) <= last; }
};

__global__ void __launch_bounds__(kThreads)
    top_p_count_kernel(const float* __restrict__ x, int64_t ldx, int n, int slice, float inv_t, TopPScratch sc) {
  grid_dependency_begin();
  const int id0 = int(blockIdx.x) * slice, len = min(slice, n - id0);
  const float* xs = x + int64_t(blockIdx.y) * ldx + id0;
  const int64_t rs = int64_t(blockIdx.y) * gridDim.x;
  __shared__ int partial[32];
  const TopPKeep keep{row_max(sc.max + rs, gridDim.x), sc.last[blockIdx.y]};
  int mine = 0;
  for_each_strided(xs, len, [&](float v) { mine += keep(v * inv_t); });
  const int total = block_sum(mine, partial);
  if (threadIdx.x == 0) sc.count[rs + blockIdx.x] = total;
}

__global__ void __launch_bounds__(kThreads)
    top_p_write_kernel(const float* __restrict__ x, int64_t ldx, int n, int slice, float inv_t, TopPScratch sc, int cap,
                       int32_t* out) {
  grid_dependency_begin();
  const int id0 = int(blockIdx.x) * slice, len = min(slice, n - id0);
  const float* xs = x + int64_t(blockIdx.y) * ldx + id0;
  const int64_t rs = int64_t(blockIdx.y) * gridDim.x;
  int32_t* o = out + int64_t(blockIdx.y) * (2 + 2 * int64_t(cap));
  int base = 0, total = 0;  // this slice's first slot in the row; the row's candidates
  for (int s = 0; s < int(gridDim.x); ++s) {
    if (s < int(blockIdx.x)) base += sc.count[rs + s];
    total += sc.count[rs + s];
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) o[0] = total;
  if (base >= cap) return;  // counted, not stored (the whole row's count says so)
  const TopPKeep keep{row_max(sc.max + rs, gridDim.x), sc.last[blockIdx.y]};
  write_in_order(len, RowWalk{xs, id0, inv_t}, keep, cap, nullptr, o + 2, o + 2 + cap, base);
}

// How top_p_rows cuts a row: as many slices of at least kMinSlice as give about kTargetBlocks
// blocks in all; 0 (one block a row) where that leaves fewer than two.
int top_p_slices(int64_t rows, int64_t n) {
  const int64_t want = std::min({(kTargetBlocks + rows - 1) / rows, n / kMinSlice, int64_t(kMaxSlices)});
  return want < 2 || rows > 65535 ? 0 : static_cast<int>(want);
}

}  // namespace

size_t top_k_scratch_bytes(int64_t rows, int64_t n, int k, int cap) {
  const Split sp = split_for(rows, n, k, cap);
  return size_t(rows) * sp.slices * (1 + 2 * size_t(sp.scap)) * sizeof(int32_t);
}

void top_k_rows(const float* x, int64_t ldx, int64_t rows, int64_t n, int k, float inv_t, int cap, int32_t* out,
                void* scratch, cudaStream_t s) {
  if (rows == 0) return;
  k = static_cast<int>(std::min<int64_t>(k, n));
  const Split sp = split_for(rows, n, k, cap);
  auto* part = static_cast<int32_t*>(scratch);
  if (sp.slices)
    launch_kernel("top_k", top_k_slices_kernel, dim3(static_cast<unsigned>(sp.slices), static_cast<unsigned>(rows)),
                  kThreads, 0, s, x, ldx, static_cast<int>(n), sp.slice, k, inv_t, sp.scap, part);
  launch_kernel("top_k", top_k_kernel, static_cast<unsigned>(rows), kThreads, 0, s, x, ldx, static_cast<int>(n), k,
                inv_t, cap, out, part, sp.slices, sp.scap);
}

size_t top_p_scratch_bytes(int64_t rows, int64_t n) {
  const int slices = top_p_slices(rows, n);
  return slices ? TopPScratch::bytes(rows, slices) : 0;
}

void top_p_rows(const float* x, int64_t ldx, int64_t rows, int64_t n, float inv_t, float top_p, int cap, int32_t* out,
                void* scratch, cudaStream_t s) {
  if (rows == 0) return;
  const int slices = top_p_slices(rows, n);
  if (slices == 0) {
    launch_kernel("top_p", top_p_kernel, static_cast<unsigned>(rows), kThreads, 0, s, x, ldx, static_cast<int>(n),
                  inv_t, top_p, cap, out);
    return;
  }
  const int slice = static_cast<int>((n + slices - 1) / slices);
  const TopPScratch sc(scratch, rows, slices);
  const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(rows));
  const int len = static_cast<int>(n);
  launch_kernel("top_p", top_p_max_kernel, grid, kThreads, 0, s, x, ldx, len, slice, inv_t, sc);
  launch_kernel("top_p", top_p_hist_kernel, grid, kThreads, 0, s, x, ldx, len, slice, inv_t, sc);
  launch_kernel("top_p", top_p_cut_kernel, static_cast<unsigned>(rows), 32, 0, s, sc, slices, top_p, cap, out);
  launch_kernel("top_p", top_p_count_kernel, grid, kThreads, 0, s, x, ldx, len, slice, inv_t, sc);
  launch_kernel("top_p", top_p_write_kernel, grid, kThreads, 0, s, x, ldx, len, slice, inv_t, sc, cap, out);
}

}  // namespace dflash::cuda
