// Qwen3's per-head q/k RMSNorm, RoPE and the KV-cache store in one launch (they were six:
// two norms, two ropes, two copies, each a few microseconds of launch for a few KB of data).
// One block per (row, head) of q, k and v; the arithmetic and roundings are those of the
// separate kernels (norm in f32, round to bf16, rotate in f32, round), so results equal the
// unfused path's bit for bit.
#include <algorithm>
#include <string>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

__global__ void qk_norm_rope_store_kernel(__nv_bfloat16* q, int64_t ldq, int hq, const __nv_bfloat16* k,
                                          int64_t ldk, const __nv_bfloat16* v, int64_t ldv, int hkv,
                                          const float* q_norm, const float* k_norm, float eps, int D,
                                          const int32_t* positions, int64_t pos0, const float* cos,
                                          const float* sin, __nv_bfloat16* k_dst, int64_t ldkd,
                                          __nv_bfloat16* v_dst, int64_t ldvd) {
  const int heads = hq + 2 * hkv;
  const int64_t r = blockIdx.x / heads;
  const int h = blockIdx.x % heads;
  const bool is_v = h >= hq + hkv, is_q = h < hq;
  const int half = D / 2;
  const float* w = is_q ? q_norm : k_norm;
  grid_dependency_begin();
  // The head, its norm weight and its cos/sin are loaded together: one trip to L2, where the
  // loop form took three in a row (the head, then the weight, then cos/sin). Fetching the
  // weight and cos/sin before the wait instead (they were written before the kernel ahead of
  // this one started) made the kernel alone faster (doctor: 5.0-5.3 → 3.2-3.7 µs) but a DFlash
  // step 1.7 % slower, plain decode unchanged (H200, 2026-11-30; not understood). A thread holds
  // at most two elements (D ≤ 512, at least D / 2 threads) and one rotation pair.
  float w_e[2] = {0.f, 0.f}, c_e = 0.f, s_e = 0.f;
  if (!is_v) {
    for (int u = 0; u < 2; ++u)
      if (const int i = int(threadIdx.x) + u * int(blockDim.x); i < D) w_e[u] = w[i];
    if (const int j = threadIdx.x; j < half) {
      const int64_t p = positions ? positions[r] : pos0 + r;
      c_e = cos[p * half + j];
      s_e = sin[p * half + j];
    }
  }
  if (is_v) {  // a v head: stored as is
    const int hv = h - hq - hkv;
    for (int i = threadIdx.x; i < D; i += blockDim.x) v_dst[r * ldvd + int64_t(hv) * D + i] = v[r * ldv + int64_t(hv) * D + i];
    return;
  }
  const __nv_bfloat16* in = is_q ? q + r * ldq + int64_t(h) * D : k + r * ldk + int64_t(h - hq) * D;
  __nv_bfloat16* out = is_q ? q + r * ldq + int64_t(h) * D : k_dst + r * ldkd + int64_t(h - hq) * D;

  // The same block size and reduction as rms_norm_kernel with group = D.
  float x_e[2] = {0.f, 0.f}, ss = 0.f;
  for (int u = 0; u < 2; ++u)
    if (const int i = int(threadIdx.x) + u * int(blockDim.x); i < D) {
      x_e[u] = __bfloat162float(in[i]);
      ss += x_e[u] * x_e[u];
    }
  __shared__ float partial[32];
  __shared__ float normed[512];
  const float total = block_sum(ss, partial);
  const float inv = rsqrtf(total / static_cast<float>(D) + eps);
  for (int u = 0; u < 2; ++u)
    if (const int i = int(threadIdx.x) + u * int(blockDim.x); i < D)
      normed[i] = __bfloat162float(__float2bfloat16_rn(w_e[u] * (x_e[u] * inv)));
  __syncthreads();  // q is rotated in place: every read of the head comes before any write

  if (const int j = threadIdx.x; j < half) {
    const float a = normed[j], b = normed[j + half];
    out[j] = __float2bfloat16_rn(a * c_e - b * s_e);
    out[j + half] = __float2bfloat16_rn(b * c_e + a * s_e);
  }
}

}  // namespace

void qk_norm_rope_store(void* q, int64_t ldq, int64_t hq, const void* k, int64_t ldk, const void* v, int64_t ldv,
                        int64_t hkv, const float* q_norm, const float* k_norm, float eps, int64_t rows,
                        int64_t head_dim, const int32_t* positions, int64_t pos0, const float* cos, const float* sin,
                        void* k_dst, int64_t ldkd, void* v_dst, int64_t ldvd, cudaStream_t s) {
  if (head_dim > 512 || head_dim % 2) throw Error("cuda qk_norm_rope_store: head_dim " + std::to_string(head_dim));
  const int64_t blocks = rows * (hq + 2 * hkv);
  if (blocks == 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(256, (head_dim + 31) / 32 * 32));
  launch_kernel("qk_norm_rope_store", qk_norm_rope_store_kernel, static_cast<unsigned>(blocks), threads, 0, s,
      static_cast<__nv_bfloat16*>(q), ldq, static_cast<int>(hq), static_cast<const __nv_bfloat16*>(k), ldk,
      static_cast<const __nv_bfloat16*>(v), ldv, static_cast<int>(hkv), q_norm, k_norm, eps,
      static_cast<int>(head_dim), positions, pos0, cos, sin, static_cast<__nv_bfloat16*>(k_dst), ldkd,
      static_cast<__nv_bfloat16*>(v_dst), ldvd);
}

}  // namespace dflash::cuda
