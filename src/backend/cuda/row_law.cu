// Sampling from whole rows where they are (Backend::row_laws, scaled_at, draw_from_row,
// draw_from_excess): for temperature alone no candidate set is smaller than the row, so the
// softmax, the draw and the acceptance rule's residual stay on the device and only token ids
// and single values come back. One block of 1024 threads a row.
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 1024;

// exp(scaled − max) in f64, 0 for NaN: the host's arithmetic (backend.cc), so that both backends
// draw the same tokens from the same uniforms.
__device__ __forceinline__ double weight(float logit, float inv_t, float max) {
  const float s = logit * inv_t;
  return s != s ? 0.0 : exp(double(s) - double(max));
}

// out[row] = {max, mass}: the max of the scaled row (NaN skipped), then Σ exp(scaled − max),
// each thread its strided elements in f64, then the threads in a fixed order.
__global__ void __launch_bounds__(kThreads)
    row_laws_kernel(const float* __restrict__ x, int64_t ldx, int n, float inv_t, double* out) {
  grid_dependency_begin();
  const float* xr = x + int64_t(blockIdx.x) * ldx;
  __shared__ float part_max[32];
  __shared__ double part_sum[32];
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < n; i += kThreads) mx = fmaxf(mx, xr[i] * inv_t);
  mx = warp_max(mx);
  if (threadIdx.x % 32 == 0) part_max[threadIdx.x / 32] = mx;
  __syncthreads();
  mx = -INFINITY;
  for (int w = 0; w < kThreads / 32; ++w) mx = fmaxf(mx, part_max[w]);
  double mass = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) mass += weight(xr[i], inv_t, mx);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mass += __shfl_xor_sync(0xffffffffu, mass, o);
  if (threadIdx.x % 32 == 0) part_sum[threadIdx.x / 32] = mass;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += part_sum[w];
    out[2 * blockIdx.x] = double(mx);
    out[2 * blockIdx.x + 1] = total;
  }
}

__global__ void scaled_at_kernel(const float* __restrict__ x, int64_t ldx, float inv_t, const int64_t* at, int count,
                                 float* out) {
  grid_dependency_begin();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) out[i] = x[at[2 * i] * ldx + at[2 * i + 1]] * inv_t;
}

// A draw from one row's weights w(i) (the row's law, or the excess of p over q): thread t sums
// its contiguous chunk in f64, a block scan of the chunk sums gives each chunk's start, and the
// first chunk that ends past u·total walks its weights to the token (the chunk's last token
// with weight where rounding leaves none in it); where no chunk does, the row's last token with
// weight; −1 when the total is 0.
struct RowWeight {
  const float* x;
  float inv_t, max;
  __device__ double operator()(int i) const { return weight(x[i], inv_t, max); }
};
struct ExcessWeight {
  const float *p, *q;
  float inv_t, p_max, q_max;
  double p_mass, q_mass;
  __device__ double operator()(int i) const {
    return fmax(0.0, weight(p[i], inv_t, p_max) / p_mass - weight(q[i], inv_t, q_max) / q_mass);
  }
};

template <typename W>
__global__ void __launch_bounds__(kThreads) draw_kernel(W w, int n, double u, int32_t* out) {
  grid_dependency_begin();
  __shared__ double warp_total[32];
  __shared__ int s_chunk, s_last;
  const int C = (n + kThreads - 1) / kThreads;
  const int i0 = min(n, int(threadIdx.x) * C), i1 = min(n, i0 + C);
  double own = 0;
  int last = -1;
  for (int i = i0; i < i1; ++i) {
    const double v = w(i);
    own += v;
    if (v > 0) last = i;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  double incl = warp_inclusive_sum(own);
  if (lane == 31) warp_total[warp] = incl;
  if (threadIdx.x == 0) {
    s_chunk = kThreads;
    s_last = -1;
  }
  __syncthreads();
  double before = 0, total = 0;  // the warps' totals in warp order: every thread the same sums
  for (int v = 0; v < kThreads / 32; ++v) {
    if (v < warp) before += warp_total[v];
    total += warp_total[v];
  }
  const double start = before + incl - own, target = u * total;
  if (last >= 0) atomicMax(&s_last, last);
  if (own > 0 && target < start + own) atomicMin(&s_chunk, int(threadIdx.x));
  __syncthreads();
  if (threadIdx.x == 0 && s_chunk == kThreads) *out = total > 0 ? s_last : -1;
  if (int(threadIdx.x) != s_chunk) return;
  double acc = start;
  int token = last;
  for (int i = i0; i < i1; ++i) {
    const double v = w(i);
    if (v <= 0) continue;
    acc += v;
    if (target < acc) {
      token = i;
      break;
    }
  }
  *out = token;
}

}  // namespace

void row_laws(const float* x, int64_t ldx, int64_t rows, int64_t n, float inv_t, double* out, cudaStream_t s) {
  if (rows == 0) return;
  launch_kernel("row_laws", row_laws_kernel, static_cast<unsigned>(rows), kThreads, 0, s, x, ldx,
                static_cast<int>(n), inv_t, out);
}

void scaled_at(const float* x, int64_t ldx, float inv_t, const int64_t* at, int count, float* out, cudaStream_t s) {
  if (count == 0) return;
  launch_kernel("scaled_at", scaled_at_kernel, static_cast<unsigned>((count + 255) / 256), 256, 0, s, x, ldx, inv_t, at,
                count, out);
}

void draw_from_row(const float* x, int64_t n, float inv_t, float max, double u, int32_t* out, cudaStream_t s) {
  launch_kernel("draw", draw_kernel<RowWeight>, 1, kThreads, 0, s, RowWeight{x, inv_t, max}, static_cast<int>(n), u,
                out);
}

void draw_from_excess(const float* p, const float* q, int64_t n, float inv_t, float p_max, double p_mass, float q_max,
                      double q_mass, double u, int32_t* out, cudaStream_t s) {
  launch_kernel("draw", draw_kernel<ExcessWeight>, 1, kThreads, 0, s,
                ExcessWeight{p, q, inv_t, p_max, q_max, p_mass, q_mass}, static_cast<int>(n), u, out);
}

}  // namespace dflash::cuda
