#pragma once
// Qwen3's per-head q/k RMSNorm, RoPE and KV-cache store, one block's work (qk_norm_rope.cu has
// the file comment), shared by its kernel and by the fused decoder layer (fused_layer.cu).
// Device code: include from .cu files only.
#include "backend/cuda/device_util.cuh"

namespace dflash::cuda::qk_norm {

struct QkNormRopeArgs {
  __nv_bfloat16* q;
  int64_t ldq;
  int hq;
  const __nv_bfloat16* k;
  int64_t ldk;
  const __nv_bfloat16* v;
  int64_t ldv;
  int hkv;
  const float* q_norm;
  const float* k_norm;
  float eps;
  int D;
  const int32_t* positions;
  int64_t pos0;
  const float* cos;
  const float* sin;
  __nv_bfloat16* k_dst;
  int64_t ldkd;
  __nv_bfloat16* v_dst;
  int64_t ldvd;
};

// One (row, head) of q, k and v: `block` = row · (hq + 2·hkv) + head. Any block size; the sums
// over a head are those of a block of D threads whatever the size (the extra warps add zeros).
__device__ __forceinline__ void qk_norm_rope_store_block(const QkNormRopeArgs& a, int64_t block) {
  __nv_bfloat16* q = a.q;
  const __nv_bfloat16* k = a.k;
  const __nv_bfloat16* v = a.v;
  const int64_t ldq = a.ldq, ldk = a.ldk, ldv = a.ldv, ldkd = a.ldkd, ldvd = a.ldvd, pos0 = a.pos0;
  const int hq = a.hq, hkv = a.hkv, D = a.D;
  const float* q_norm = a.q_norm;
  const float* k_norm = a.k_norm;
  const float eps = a.eps;
  const int32_t* positions = a.positions;
  const float* cos = a.cos;
  const float* sin = a.sin;
  __nv_bfloat16* k_dst = a.k_dst;
  __nv_bfloat16* v_dst = a.v_dst;
  const int heads = hq + 2 * hkv;
  const int64_t r = block / heads;
  const int h = static_cast<int>(block % heads);
  if (h >= hq + hkv) {  // a v head: stored as is
    const int hv = h - hq - hkv;
    for (int i = threadIdx.x; i < D; i += blockDim.x) v_dst[r * ldvd + int64_t(hv) * D + i] = v[r * ldv + int64_t(hv) * D + i];
    return;
  }
  const bool is_q = h < hq;
  const __nv_bfloat16* in = is_q ? q + r * ldq + int64_t(h) * D : k + r * ldk + int64_t(h - hq) * D;
  __nv_bfloat16* out = is_q ? q + r * ldq + int64_t(h) * D : k_dst + r * ldkd + int64_t(h - hq) * D;
  const float* w = is_q ? q_norm : k_norm;

  // The same block size and reduction as rms_norm_kernel with group = D.
  float ss = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const float x = __bfloat162float(in[i]);
    ss += x * x;
  }
  __shared__ float partial[32];
  __shared__ float normed[512];
  const float total = block_sum(ss, partial);
  const float inv = rsqrtf(total / static_cast<float>(D) + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x)
    normed[i] = __bfloat162float(__float2bfloat16_rn(w[i] * (__bfloat162float(in[i]) * inv)));
  __syncthreads();  // q is rotated in place: every read of the head comes before any write

  const int half = D / 2;
  const int64_t p = positions ? positions[r] : pos0 + r;
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    const float c = cos[p * half + j], s = sin[p * half + j];
    const float a = normed[j], b = normed[j + half];
    out[j] = __float2bfloat16_rn(a * c - b * s);
    out[j + half] = __float2bfloat16_rn(b * c + a * s);
  }
}

}  // namespace dflash::cuda::qk_norm
