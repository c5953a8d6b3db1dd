// One (row, head) of Qwen3's q/k-norm, RoPE and KV-cache store: the body of the
// qk_norm_rope_store kernel (qk_norm_rope.cu) and of the first stage of the attention chain
// (attention.cu), one source so that both compute every value the same way.
#pragma once

#include "backend/cuda/device_util.cuh"

namespace dflash::cuda {

struct QkNormRopeArgs {
  __nv_bfloat16* q;  // rotated in place; hq may be 0
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
  const int32_t* positions;  // null: row r is at pos0 + r
  int64_t pos0;
  const float* cos;
  const float* sin;
  __nv_bfloat16* k_dst;
  int64_t ldkd;
  __nv_bfloat16* v_dst;
  int64_t ldvd;
};

// The threads one unit takes: the separate kernel's block size.
__host__ __device__ constexpr int qk_norm_unit_threads(int D) { return D + 31 < 256 ? (D + 31) / 32 * 32 : 256; }

// Unit r·(hq + 2·hkv) + h (h: q heads, then k heads, then v heads, stored as they are) by the
// n threads tid = 0 … n − 1 of a group of whole warps; unit < 0 does nothing. Every thread of
// the block must make the same calls (the barriers are the block's), so several groups of a
// block can each take a unit at once. `partial` holds the group's n/32 warp sums, `normed` D
// floats; the sum of squares is the warp butterflies, then the warps in order, as block_sum
// over n threads. L2 reads (`from_l2`) where this SM's L1 could hold lines another block of
// the same kernel writes.
template <bool kFromL2>
__device__ __forceinline__ void qk_norm_rope_unit(const QkNormRopeArgs& a, int64_t unit, int tid, int n,
                                                  float* partial, float* normed) {
  const int heads = a.hq + 2 * a.hkv, D = a.D;
  const bool live = unit >= 0;
  const int64_t r = live ? unit / heads : 0;
  const int h = live ? static_cast<int>(unit % heads) : 0;
  const bool is_v = h >= a.hq + a.hkv, is_q = h < a.hq;
  auto load = [](const __nv_bfloat16* p) { return kFromL2 ? __ldcg(p) : *p; };
  if (live && is_v) {
    const int hv = h - a.hq - a.hkv;
    for (int i = tid; i < D; i += n) a.v_dst[r * a.ldvd + int64_t(hv) * D + i] = load(a.v + r * a.ldv + int64_t(hv) * D + i);
  }
  const bool norm = live && !is_v;
  const __nv_bfloat16* in = !norm ? nullptr : is_q ? a.q + r * a.ldq + int64_t(h) * D : a.k + r * a.ldk + int64_t(h - a.hq) * D;
  __nv_bfloat16* out = !norm ? nullptr : is_q ? a.q + r * a.ldq + int64_t(h) * D : a.k_dst + r * a.ldkd + int64_t(h - a.hq) * D;
  const float* w = is_q ? a.q_norm : a.k_norm;

  float ss = 0.f;
  if (norm)
    for (int i = tid; i < D; i += n) {
      const float x = __bfloat162float(load(in + i));
      ss += x * x;
    }
  ss = warp_sum(ss);
  if (tid % 32 == 0) partial[tid / 32] = ss;
  __syncthreads();
  float total = 0;
  for (int i = 0; i < n / 32; ++i) total += partial[i];
  const float inv = rsqrtf(total / static_cast<float>(D) + a.eps);
  if (norm)
    for (int i = tid; i < D; i += n) normed[i] = __bfloat162float(__float2bfloat16_rn(w[i] * (__bfloat162float(load(in + i)) * inv)));
  __syncthreads();  // q is rotated in place: every read of the head comes before any write

  if (norm) {
    const int half = D / 2;
    const int64_t p = a.positions ? a.positions[r] : a.pos0 + r;
    for (int j = tid; j < half; j += n) {
      const float c = a.cos[p * half + j], s = a.sin[p * half + j];
      const float x0 = normed[j], x1 = normed[j + half];
      out[j] = __float2bfloat16_rn(x0 * c - x1 * s);
      out[j + half] = __float2bfloat16_rn(x1 * c + x0 * s);
    }
  }
}

}  // namespace dflash::cuda
