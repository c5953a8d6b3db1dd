// Sampling from whole rows where they are (Backend::row_laws, scaled_at, draw_from_rows,
// draw_from_excess): for temperature alone no candidate set is smaller than the row, so the
// softmax, the draw and the acceptance rule's residual stay on the device and only token ids
// and single values come back. The weights are f64 (the host's arithmetic), so one block a row
// would be bound by one SM's f64 units (85 µs a draw from a 151 936-token row): a row is cut
// into slices of kSlice tokens, a block each, and a second launch combines the slices in order.
// A top-p law (Backend::top_p_laws) is the same softmax over the tokens at or above a cut, which
// is found here too (below), so a flat row's nucleus never leaves the device either.
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/top_p_fixed.h"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kSlice = 8192;                  // tokens a slice block weighs
constexpr int kChunk = kSlice / kThreads;     // contiguous tokens a thread weighs in a draw
constexpr int kWarps = kThreads / 32;

int slices_of(int64_t n) { return static_cast<int>((n + kSlice - 1) / kSlice); }

// exp(scaled − max) in f64, 0 for NaN and −inf: the host's arithmetic (backend.cc), so that
// both backends draw the same tokens from the same uniforms.
__device__ __forceinline__ double weight(float logit, float inv_t, float max) {
  const float s = logit * inv_t;
  return s != s || s == -INFINITY ? 0.0 : exp(double(s) - double(max));
}

__device__ __forceinline__ bool admits(LawCut c, float s, int id) {
  return s > c.cut || (s == c.cut && id >= c.cut_id);
}

// Token i's weight under its row's law: weight(), 0 where the cut does not admit it.
struct RowWeight {
  const float* x;
  float inv_t, max;
  LawCut cut;
  __device__ double operator()(int i) const {
    return admits(cut, x[i] * inv_t, i) ? weight(x[i], inv_t, max) : 0.0;
  }
};

// partial[r][s] = {max, Σ exp(scaled − max)} of slice s of row r, the sum over the tokens
// cuts[r] admits (every token without cuts) strided by thread then over the warps in order (the
// max, of every token, is exact in any order).
__global__ void __launch_bounds__(kThreads)
    law_slices_kernel(const float* __restrict__ x, int64_t ldx, int n, float inv_t, const LawCut* cuts,
                      double* partial) {
  grid_dependency_begin();
  const float* xr = x + int64_t(blockIdx.y) * ldx;
  const LawCut cut = cuts ? cuts[blockIdx.y] : LawCut{-INFINITY, 0};
  const int i0 = blockIdx.x * kSlice, i1 = min(n, i0 + kSlice);
  __shared__ float part_max[kWarps];
  __shared__ double part_sum[32];
  float mx = -INFINITY;
  for (int i = i0 + threadIdx.x; i < i1; i += kThreads) mx = fmaxf(mx, xr[i] * inv_t);
  mx = warp_max(mx);
  if (threadIdx.x % 32 == 0) part_max[threadIdx.x / 32] = mx;
  __syncthreads();
  mx = -INFINITY;
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, part_max[w]);
  double sum = 0;
  const RowWeight w{xr, inv_t, mx, cut};
  for (int i = i0 + threadIdx.x; i < i1; i += kThreads) sum += w(i);
  const double total = block_sum(sum, part_sum);
  if (threadIdx.x == 0) {
    double* out = partial + 2 * (int64_t(blockIdx.y) * gridDim.x + blockIdx.x);
    out[0] = double(mx);
    out[1] = total;
  }
}

// out[r] = {max, mass}: the slices' max, and their sums rescaled to it, added in slice order.
__global__ void law_combine_kernel(const double* __restrict__ partial, int rows, int slices, double* out) {
  grid_dependency_begin();
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const double* p = partial + 2 * int64_t(r) * slices;
  double mx = -INFINITY;
  for (int s = 0; s < slices; ++s) mx = fmax(mx, p[2 * s]);
  double mass = 0;
  if (mx != -INFINITY)
    for (int s = 0; s < slices; ++s)
      if (p[2 * s] != -INFINITY) mass += p[2 * s + 1] * exp(p[2 * s] - mx);
  out[2 * r] = mx;
  out[2 * r + 1] = mass;
}

__global__ void scaled_at_kernel(const float* __restrict__ x, int64_t ldx, float inv_t, const int64_t* at, int count,
                                 float* out) {
  grid_dependency_begin();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) out[i] = x[at[2 * i] * ldx + at[2 * i + 1]] * inv_t;
}

// A draw from one row's weights w(i) (a row's law, or the excess of p over q), in two launches.
// Slices: thread t of slice s sums its kChunk contiguous tokens, the warps scan, and the
// slice's total is the warps' totals in order. Pick: the slices' totals in order give the
// row's total and the first slice ending past u·total; that slice's sums are recomputed the
// same way, and the first thread whose running end passes u·total walks its tokens to the
// draw; where rounding leaves the crossing to no token, the last token with weight of the
// thread or slice. −1 when the total is 0. Block row r draws the source's row r.
// Rows of x, each with its law ({max, mass} as row_laws writes them, and its cut where given)
// and its uniform; the drawn id's scaled logit goes with it.
struct RowsSource {
  const float* x;
  int64_t ldx;
  float inv_t;
  const double* law;
  const LawCut* cuts;  // null: every token admitted
  const double* u;
  int32_t* ids;
  float* scaled;
  __device__ RowWeight weights(int r) const {
    return {x + r * ldx, inv_t, static_cast<float>(law[2 * r]), cuts ? cuts[r] : LawCut{-INFINITY, 0}};
  }
  __device__ double uniform(int r) const { return u[r]; }
  __device__ void write(int r, int32_t id) const {
    ids[r] = id;
    scaled[r] = id < 0 ? 0.f : x[r * ldx + id] * inv_t;
  }
};
struct ExcessWeight {
  RowWeight p, q;
  double p_mass, q_mass;
  __device__ double operator()(int i) const { return fmax(0.0, p(i) / p_mass - q(i) / q_mass); }
};
struct ExcessSource {
  ExcessWeight w;
  double u;
  int32_t* id;
  __device__ ExcessWeight weights(int) const { return w; }
  __device__ double uniform(int) const { return u; }
  __device__ void write(int, int32_t token) const { *id = token; }
};

// This thread's chunk of slice s: its sum, and the slice's running sum up to its end (the
// warps' totals in order, then the warp's inclusive scan), the same bits in both launches.
template <typename W>
__device__ void chunk_sums(const W& w, int n, int s, double* warp_total, double& own, double& end, int& last) {
  const int i0 = min(n, s * kSlice + int(threadIdx.x) * kChunk), i1 = min(n, i0 + kChunk);
  own = 0;
  last = -1;
  for (int i = i0; i < i1; ++i) {
    const double v = w(i);
    own += v;
    if (v > 0) last = i;
  }
  const double incl = warp_inclusive_sum(own);
  if (threadIdx.x % 32 == 31) warp_total[threadIdx.x / 32] = incl;
  __syncthreads();
  double before = 0;
  for (int v = 0; v < int(threadIdx.x) / 32; ++v) before += warp_total[v];
  end = before + incl;
}

template <typename Source>
__global__ void __launch_bounds__(kThreads) draw_slices_kernel(Source src, int n, double* totals) {
  grid_dependency_begin();
  __shared__ double warp_total[kWarps];
  double own, end;
  int last;
  chunk_sums(src.weights(blockIdx.y), n, blockIdx.x, warp_total, own, end, last);
  if (threadIdx.x == kThreads - 1) totals[int64_t(blockIdx.y) * gridDim.x + blockIdx.x] = end;
}

template <typename Source>
__global__ void __launch_bounds__(kThreads) draw_pick_kernel(Source src, int n, int slices, const double* totals) {
  grid_dependency_begin();
  __shared__ double warp_total[kWarps];
  __shared__ double s_prefix, s_target;
  __shared__ int s_slice, s_thread, s_last;
  const int r = blockIdx.x;
  if (threadIdx.x == 0) {
    s_last = -1;
    const double* t = totals + int64_t(r) * slices;
    double total = 0;
    for (int s = 0; s < slices; ++s) total += t[s];
    const double target = src.uniform(r) * total;
    s_slice = -1;
    s_thread = kThreads;
    s_target = target;
    double prefix = 0;
    if (total > 0)
      for (int s = 0; s < slices; ++s) {
        if (t[s] > 0 && target < prefix + t[s]) {
          s_slice = s;
          break;
        }
        prefix += t[s];
      }
    s_prefix = prefix;
    if (s_slice < 0) src.write(r, -1);
  }
  __syncthreads();
  if (s_slice < 0) return;
  const auto w = src.weights(r);
  double own, end;
  int last;
  chunk_sums(w, n, s_slice, warp_total, own, end, last);
  const double target = s_target, start = s_prefix + (end - own);
  if (own > 0 && target < s_prefix + end) atomicMin(&s_thread, int(threadIdx.x));
  if (last >= 0) atomicMax(&s_last, last);
  __syncthreads();
  // The scan groups a thread's running end differently from the slice's total, so rounding
  // can leave the slice's crossing to no thread: then its last token with weight.
  if (threadIdx.x == 0 && s_thread == kThreads) src.write(r, s_last);
  if (int(threadIdx.x) != s_thread) return;
  double acc = start;
  int token = last;
  const int i0 = s_slice * kSlice + int(threadIdx.x) * kChunk, i1 = min(n, i0 + kChunk);
  for (int i = i0; i < i1; ++i) {
    const double v = w(i);
    if (v <= 0) continue;
    acc += v;
    if (target < acc) {
      token = i;
      break;
    }
  }
  src.write(r, token);
}

template <typename Source>
void draw(const char* op, const Source& src, int64_t rows, int64_t n, void* scratch, cudaStream_t s) {
  const int slices = slices_of(n);
  auto* totals = static_cast<double*>(scratch);
  launch_kernel(op, draw_slices_kernel<Source>, dim3(slices, static_cast<unsigned>(rows)), dim3(kThreads), 0, s, src,
                static_cast<int>(n), totals);
  launch_kernel(op, draw_pick_kernel<Source>, static_cast<unsigned>(rows), kThreads, 0, s, src, static_cast<int>(n),
                slices, static_cast<const double*>(totals));
}

// Top-p's cut. Each token's weight is fixed to an integer (top_p_fixed.h) and its scaled logit
// to a 32-bit key in ascending order; the cut is the token, in ascending (key, id) order, where
// the running sum of fixed weights first exceeds the dropped mass ⌊(1 − top_p)·total⌋. Three
// rounds of histograms over the key's bits (11, 11, 10: the fixed weights of each bin summed in
// 64-bit integers, exact in any order) narrow it to one key; among the tokens of that key, all
// of one weight, the running sum left over gives how many are dropped, and a walk in id order
// finds the first one kept. The law's mass is then the f64 sum of the kept weights, by slices
// (law_slices_kernel with the cuts).
constexpr int kCutBins = 2048;

struct CutState {
  uint32_t key;         // the key bits found so far
  uint32_t empty;       // nothing finite in the row: nothing admitted
  uint64_t residual;    // the dropped mass not yet accounted for by keys below `key`
};

// Ascending keys of scaled logits (−0 as +0, so that equal values share a key).
__device__ __forceinline__ uint32_t order_key(float s) {
  uint32_t b = __float_as_uint(s);
  if ((b << 1) == 0) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Round `level` (0, 1, 2): the fixed weights of the tokens whose key agrees with the bits found
// so far, by their next bits, block by block into hist[row][bin].
__global__ void __launch_bounds__(kThreads)
    cut_hist_kernel(const float* __restrict__ x, int64_t ldx, int n, float inv_t, const double* law,
                    const CutState* state, unsigned long long* hist, int level) {
  grid_dependency_begin();
  const int r = blockIdx.y;
  __shared__ unsigned long long bins[kCutBins];
  for (int b = threadIdx.x; b < kCutBins; b += kThreads) bins[b] = 0;
  __syncthreads();
  const CutState st = state ? state[r] : CutState{0, 0, 0};
  if (!st.empty) {
    const float* xr = x + int64_t(r) * ldx;
    const float mx = static_cast<float>(law[2 * r]);
    const int shift = level == 0 ? 21 : level == 1 ? 10 : 0, known = level == 0 ? 32 : level == 1 ? 21 : 10;
    const uint32_t mask = level == 2 ? 1023u : 2047u;
    const int i0 = blockIdx.x * kSlice, i1 = min(n, i0 + kSlice);
    for (int i = i0 + threadIdx.x; i < i1; i += kThreads) {
      const float s = xr[i] * inv_t;
      if (s != s) continue;
      const uint32_t key = order_key(s);
      if (known < 32 && (key >> known) != st.key) continue;
      const unsigned long long f = top_p_fixed_weight(weight(xr[i], inv_t, mx));
      if (f) atomicAdd(&bins[(key >> shift) & mask], f);
    }
  }
  __syncthreads();
  unsigned long long* h = hist + int64_t(r) * kCutBins;
  for (int b = threadIdx.x; b < kCutBins; b += kThreads)
    if (bins[b]) atomicAdd(&h[b], bins[b]);
}

// One block a row: the bin where the running sum passes the residual (on round 0, the dropped
// mass of the whole row), which extends the key; the histogram is left zero for the next round.
__global__ void __launch_bounds__(kThreads)
    cut_select_kernel(unsigned long long* hist, CutState* state, float top_p, int level) {
  grid_dependency_begin();
  const int r = blockIdx.x;
  const int bins = level == 2 ? 1024 : kCutBins, per = bins / kThreads;
  unsigned long long* h = hist + int64_t(r) * kCutBins;
  unsigned long long mine[kCutBins / kThreads], own = 0;
  for (int j = 0; j < per; ++j) {
    mine[j] = h[threadIdx.x * per + j];
    h[threadIdx.x * per + j] = 0;
    own += mine[j];
  }
  __shared__ unsigned long long warp_total[kWarps];
  __shared__ CutState st;
  const unsigned long long incl = warp_inclusive_sum(own);
  if (threadIdx.x % 32 == 31) warp_total[threadIdx.x / 32] = incl;
  if (threadIdx.x == 0) st = level == 0 ? CutState{0, 0, 0} : state[r];
  __syncthreads();
  unsigned long long before = incl - own, total = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < int(threadIdx.x) / 32) before += warp_total[w];
    total += warp_total[w];
  }
  if (st.empty) return;
  uint64_t residual = st.residual;
  if (level == 0) {
    if (total == 0) {  // only NaN and −inf
      if (threadIdx.x == 0) state[r] = CutState{0, 1, 0};
      return;
    }
    const uint64_t drop = top_p_drop_fixed(top_p, total);
    residual = drop < total ? drop : total - 1;  // at least the largest token is kept
  }
  if (!(before <= residual && residual < before + own)) return;  // one thread holds the crossing
  for (int j = 0; j < per; ++j) {
    if (residual < before + mine[j]) {
      const int bin = threadIdx.x * per + j;
      state[r] = CutState{level == 0 ? uint32_t(bin) : (st.key << (level == 2 ? 10 : 11)) | uint32_t(bin), 0,
                          residual - before};
      return;
    }
    before += mine[j];
  }
}

// One block a row: the top-p cut's value, and its id where some tokens of that value are
// dropped (state null: no top-p); then the stricter of it and min-p's cut.
__global__ void __launch_bounds__(kThreads)
    cut_finish_kernel(const float* __restrict__ x, int64_t ldx, int n, float inv_t, const double* law,
                      const CutState* state, float min_p, LawCut* cuts) {
  grid_dependency_begin();
  const int r = blockIdx.x;
  const float mx = static_cast<float>(law[2 * r]);
  if (mx == -INFINITY || (state && state[r].empty)) {  // nothing finite
    if (threadIdx.x == 0) cuts[r] = LawCut{INFINITY, 0};
    return;
  }
  const float min_p_at = min_p_cut(mx, min_p);
  if (!state) {
    if (threadIdx.x == 0) cuts[r] = LawCut{min_p_at, 0};
    return;
  }
  const CutState st = state[r];
  const float cut = key_value(st.key);
  if (min_p_at > cut) {
    if (threadIdx.x == 0) cuts[r] = LawCut{min_p_at, 0};
    return;
  }
  const uint64_t f = top_p_fixed_weight(exp(double(cut) - double(mx)));
  const uint64_t dropped = st.residual / f;  // tokens of the cut's value below the first kept
  if (dropped == 0) {
    if (threadIdx.x == 0) cuts[r] = LawCut{cut, 0};
    return;
  }
  const float* xr = x + int64_t(r) * ldx;
  __shared__ int warp_count[kWarps];
  __shared__ int found;
  if (threadIdx.x == 0) found = -1;
  uint64_t seen = 0;  // tokens of the cut's value before this tile
  for (int t0 = 0; t0 < n; t0 += kThreads) {
    const int i = t0 + threadIdx.x;
    const bool tie = i < n && xr[i] * inv_t == cut;
    const unsigned ballot = __ballot_sync(0xffffffffu, tie);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = __popc(ballot & ((1u << lane) - 1u)), tile = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) before += warp_count[w];
      tile += warp_count[w];
    }
    if (tie && seen + uint64_t(before) == dropped) found = i;
    __syncthreads();
    if (found >= 0) break;
    seen += uint64_t(tile);
  }
  if (threadIdx.x == 0) cuts[r] = LawCut{cut, found};
}

}  // namespace

size_t top_p_law_scratch_bytes(int64_t rows, int64_t n) {
  return row_law_scratch_bytes(rows, n) + size_t(rows) * (kCutBins * sizeof(unsigned long long) + sizeof(CutState));
}

void top_p_laws(const float* x, int64_t ldx, int64_t rows, int64_t n, float inv_t, float top_p, float min_p,
                double* laws, LawCut* cuts, void* scratch, cudaStream_t s) {
  if (rows == 0) return;
  const int slices = slices_of(n);
  auto* partial = static_cast<double*>(scratch);
  auto* hist = reinterpret_cast<unsigned long long*>(static_cast<char*>(scratch) + row_law_scratch_bytes(rows, n));
  auto* state = reinterpret_cast<CutState*>(hist + rows * kCutBins);
  row_laws(x, ldx, rows, n, inv_t, laws, scratch, s);
  const bool top_p_cut = top_p < 1.f;
  if (top_p_cut)
    check(cudaMemsetAsync(hist, 0, size_t(rows) * kCutBins * sizeof(unsigned long long), s), "top_p_laws", "memset");
  const dim3 grid(slices, static_cast<unsigned>(rows));
  for (int level = 0; top_p_cut && level < 3; ++level) {
    launch_kernel("top_p_laws", cut_hist_kernel, grid, dim3(kThreads), 0, s, x, ldx, static_cast<int>(n), inv_t,
                  static_cast<const double*>(laws), level == 0 ? static_cast<const CutState*>(nullptr) : state, hist,
                  level);
    launch_kernel("top_p_laws", cut_select_kernel, static_cast<unsigned>(rows), kThreads, 0, s, hist, state, top_p,
                  level);
  }
  launch_kernel("top_p_laws", cut_finish_kernel, static_cast<unsigned>(rows), kThreads, 0, s, x, ldx,
                static_cast<int>(n), inv_t, static_cast<const double*>(laws),
                top_p_cut ? static_cast<const CutState*>(state) : nullptr, min_p, cuts);
  launch_kernel("top_p_laws", law_slices_kernel, grid, dim3(kThreads), 0, s, x, ldx, static_cast<int>(n), inv_t,
                static_cast<const LawCut*>(cuts), partial);
  launch_kernel("top_p_laws", law_combine_kernel, static_cast<unsigned>((rows + 31) / 32), 32, 0, s,
                static_cast<const double*>(partial), static_cast<int>(rows), slices, laws);
}

size_t row_law_scratch_bytes(int64_t rows, int64_t n) { return size_t(rows) * slices_of(n) * 2 * sizeof(double); }

void row_laws(const float* x, int64_t ldx, int64_t rows, int64_t n, float inv_t, double* out, void* scratch,
              cudaStream_t s) {
  if (rows == 0) return;
  const int slices = slices_of(n);
  auto* partial = static_cast<double*>(scratch);
  launch_kernel("row_laws", law_slices_kernel, dim3(slices, static_cast<unsigned>(rows)), dim3(kThreads), 0, s, x, ldx,
                static_cast<int>(n), inv_t, static_cast<const LawCut*>(nullptr), partial);
  launch_kernel("row_laws", law_combine_kernel, static_cast<unsigned>((rows + 31) / 32), 32, 0, s,
                static_cast<const double*>(partial), static_cast<int>(rows), slices, out);
}

void scaled_at(const float* x, int64_t ldx, float inv_t, const int64_t* at, int count, float* out, cudaStream_t s) {
  if (count == 0) return;
  launch_kernel("scaled_at", scaled_at_kernel, static_cast<unsigned>((count + 255) / 256), 256, 0, s, x, ldx, inv_t, at,
                count, out);
}

void draw_from_rows(const float* x, int64_t ldx, int64_t rows, int64_t n, float inv_t, const double* u, double* laws,
                    const LawCut* cuts, int32_t* ids, float* scaled, void* scratch, cudaStream_t s) {
  if (rows == 0) return;
  // Without cuts the laws are worked out first (their scratch is read before the draw's is written).
  if (!cuts) row_laws(x, ldx, rows, n, inv_t, laws, scratch, s);
  draw("draw", RowsSource{x, ldx, inv_t, laws, cuts, u, ids, scaled}, rows, n, scratch, s);
}

void draw_from_excess(const float* p, const float* q, int64_t n, float inv_t, float p_max, double p_mass, LawCut p_cut,
                      float q_max, double q_mass, LawCut q_cut, double u, int32_t* out, void* scratch, cudaStream_t s) {
  const ExcessWeight w{RowWeight{p, inv_t, p_max, p_cut}, RowWeight{q, inv_t, q_max, q_cut}, p_mass, q_mass};
  draw("draw", ExcessSource{w, u, out}, 1, n, scratch, s);
}

}  // namespace dflash::cuda
