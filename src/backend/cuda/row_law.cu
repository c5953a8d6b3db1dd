// Sampling from whole rows where they are (Backend::row_laws, scaled_at, draw_from_rows,
// draw_from_excess): for temperature alone no candidate set is smaller than the row, so the
// softmax, the draw and the acceptance rule's residual stay on the device and only token ids
// and single values come back. The weights are f64 (the host's arithmetic), so one block a row
// would be bound by one SM's f64 units (85 µs a draw from a 151 936-token row): a row is cut
// into slices of kSlice tokens, a block each, and a second launch combines the slices in order.
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

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

// partial[r][s] = {max, Σ exp(scaled − max)} of slice s of row r, the sum strided by thread
// then over the warps in order (the max is exact in any order).
__global__ void __launch_bounds__(kThreads)
    law_slices_kernel(const float* __restrict__ x, int64_t ldx, int n, float inv_t, double* partial) {
  grid_dependency_begin();
  const float* xr = x + int64_t(blockIdx.y) * ldx;
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
  for (int i = i0 + threadIdx.x; i < i1; i += kThreads) sum += weight(xr[i], inv_t, mx);
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
struct RowWeight {
  const float* x;
  float inv_t, max;
  __device__ double operator()(int i) const { return weight(x[i], inv_t, max); }
};
// Rows of x, each with its law ({max, mass} as row_laws writes them) and its uniform; the drawn
// id's scaled logit goes with it.
struct RowsSource {
  const float* x;
  int64_t ldx;
  float inv_t;
  const double* law;
  const double* u;
  int32_t* ids;
  float* scaled;
  __device__ RowWeight weights(int r) const { return {x + r * ldx, inv_t, static_cast<float>(law[2 * r])}; }
  __device__ double uniform(int r) const { return u[r]; }
  __device__ void write(int r, int32_t id) const {
    ids[r] = id;
    scaled[r] = id < 0 ? 0.f : x[r * ldx + id] * inv_t;
  }
};
struct ExcessWeight {
  const float *p, *q;
  float inv_t, p_max, q_max;
  double p_mass, q_mass;
  __device__ double operator()(int i) const {
    return fmax(0.0, weight(p[i], inv_t, p_max) / p_mass - weight(q[i], inv_t, q_max) / q_mass);
  }
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

}  // namespace

size_t row_law_scratch_bytes(int64_t rows, int64_t n) { return size_t(rows) * slices_of(n) * 2 * sizeof(double); }

void row_laws(const float* x, int64_t ldx, int64_t rows, int64_t n, float inv_t, double* out, void* scratch,
              cudaStream_t s) {
  if (rows == 0) return;
  const int slices = slices_of(n);
  auto* partial = static_cast<double*>(scratch);
  launch_kernel("row_laws", law_slices_kernel, dim3(slices, static_cast<unsigned>(rows)), dim3(kThreads), 0, s, x, ldx,
                static_cast<int>(n), inv_t, partial);
  launch_kernel("row_laws", law_combine_kernel, static_cast<unsigned>((rows + 31) / 32), 32, 0, s,
                static_cast<const double*>(partial), static_cast<int>(rows), slices, out);
}

void scaled_at(const float* x, int64_t ldx, float inv_t, const int64_t* at, int count, float* out, cudaStream_t s) {
  if (count == 0) return;
  launch_kernel("scaled_at", scaled_at_kernel, static_cast<unsigned>((count + 255) / 256), 256, 0, s, x, ldx, inv_t, at,
                count, out);
}

void draw_from_rows(const float* x, int64_t ldx, int64_t rows, int64_t n, float inv_t, const double* u, double* laws,
                    int32_t* ids, float* scaled, void* scratch, cudaStream_t s) {
  if (rows == 0) return;
  row_laws(x, ldx, rows, n, inv_t, laws, scratch, s);  // its scratch is read before the draw's is written
  draw("draw", RowsSource{x, ldx, inv_t, laws, u, ids, scaled}, rows, n, scratch, s);
}

void draw_from_excess(const float* p, const float* q, int64_t n, float inv_t, float p_max, double p_mass, float q_max,
                      double q_mass, double u, int32_t* out, void* scratch, cudaStream_t s) {
  draw("draw", ExcessSource{ExcessWeight{p, q, inv_t, p_max, q_max, p_mass, q_mass}, u, out}, 1, n, scratch, s);
}

}  // namespace dflash::cuda
