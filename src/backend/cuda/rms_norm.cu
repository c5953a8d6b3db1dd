// Grouped RMSNorm: one block per (row, group). With group = hidden size it is the layer norm;
// with group = head_dim it is Qwen3's per-head q/k norm over a [T, heads·head_dim] view.
#include <algorithm>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace dflash::cuda {
namespace {

template <typename In, typename W, typename Out>
__global__ void rms_norm_kernel(const In* x, int64_t ldx, const W* w, Out* y, int64_t ldy, int64_t groups,
                                int64_t group, float eps) {
  const int64_t r = blockIdx.x / groups, g = blockIdx.x % groups;
  const In* in = x + r * ldx + g * group;
  Out* out = y + r * ldy + g * group;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < group; i += blockDim.x) {
    const float v = to_f32(in[i]);
    ss += v * v;
  }
  __shared__ float partial[32];
  ss = warp_sum(ss);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = (blockDim.x + 31) / 32;
  if (lane == 0) partial[warp] = ss;
  // Also orders every read of the row above before the writes below: y may alias x.
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < warps; ++i) total += partial[i];
  const float inv = rsqrtf(total / static_cast<float>(group) + eps);
  for (int64_t i = threadIdx.x; i < group; i += blockDim.x)
    out[i] = from_f32<Out>(to_f32(w[i]) * (to_f32(in[i]) * inv));
}

}  // namespace

void rms_norm(const void* x, int64_t ldx, Elem x_elem, const void* w, Elem w_elem, void* y, int64_t ldy,
              Elem y_elem, int64_t rows, int64_t cols, int64_t group, float eps, cudaStream_t s) {
  const int64_t groups = cols / group, blocks = rows * groups;
  if (blocks == 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(256, (group + 31) / 32 * 32));
  dispatch_elem(x_elem, [&](auto xi) {
    dispatch_elem(w_elem, [&](auto wi) {
      dispatch_elem(y_elem, [&](auto yi) {
        using In = decltype(xi);
        using W = decltype(wi);
        using Out = decltype(yi);
        rms_norm_kernel<In, W, Out><<<static_cast<unsigned>(blocks), threads, 0, s>>>(
            static_cast<const In*>(x), ldx, static_cast<const W*>(w), static_cast<Out*>(y), ldy, groups, group, eps);
      });
    });
  });
  check_launch("rms_norm");
}

}  // namespace dflash::cuda
