#pragma once
// One head's q/k RMSNorm and RoPE by one warp: the arithmetic of qk_norm_rope_store's kernels
// (qk_norm_rope.cu), shared with the attention that does a decode row's norm itself
// (attention.cu, FusedNewRow), so both give the same bits.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/device_util.cuh"

namespace dflash::cuda {

// Lane l holds elements l + 32·w, w < D / 32: the sum of squares is taken as the block kernel
// takes it (one butterfly per group of 32 elements, the groups' totals added in order from 0),
// and the rotation's pairs j, j + D/2 sit in one lane (D % 64 == 0). The rotated head goes to
// out_a and, unless null, out_b; each lane writes only elements it read, so out_a may be `in`.
template <int D>
__device__ __forceinline__ void qk_norm_rope_head(const __nv_bfloat16* in, const float* norm_w, float eps,
                                                  const float* cos, const float* sin, int64_t pos, int lane,
                                                  __nv_bfloat16* out_a, __nv_bfloat16* out_b) {
  static_assert(D % 64 == 0 && D <= 256, "rotation pairs in one lane");
  constexpr int W = D / 32, HALF = D / 2;
  float x[W];
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < W; ++w) {
    x[w] = __bfloat162float(in[lane + 32 * w]);
    total += warp_sum(x[w] * x[w]);
  }
  const float inv = rsqrtf(total / static_cast<float>(D) + eps);
  float normed[W];
#pragma unroll
  for (int w = 0; w < W; ++w) normed[w] = __bfloat162float(__float2bfloat16_rn(norm_w[lane + 32 * w] * (x[w] * inv)));
#pragma unroll
  for (int w = 0; w < W / 2; ++w) {
    const int j = lane + 32 * w;
    const float c = cos[pos * HALF + j], s = sin[pos * HALF + j];
    const float a = normed[w], b = normed[w + W / 2];
    const __nv_bfloat16 lo = __float2bfloat16_rn(a * c - b * s), hi = __float2bfloat16_rn(b * c + a * s);
    out_a[j] = lo;
    out_a[j + HALF] = hi;
    if (out_b) {
      out_b[j] = lo;
      out_b[j + HALF] = hi;
    }
  }
}

}  // namespace dflash::cuda
