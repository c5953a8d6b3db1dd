// Qwen3's per-head q/k RMSNorm, RoPE and the KV-cache store in one launch (they were six:
// two norms, two ropes, two copies, each a few microseconds of launch for a few KB of data).
// The roundings are those of the separate kernels (norm in f32, round to bf16, rotate in f32,
// round). Two kernels, chosen from head_dim, pointers and strides only (never the row count, so
// a decode row and the same row in a verification block are computed alike):
// - head_dim a multiple of 16 with D/16 a power of two, 16-byte aligned rows: D/16 lanes per
//   (row, head), each holding 8 elements and their 8 rotation partners, the sum of squares over
//   a fixed xor butterfly of those lanes. A 16-row verification block at Qwen3-8B shapes is 24
//   blocks of 256 threads.
// - otherwise one block per (row, head), the block reduction of rms_norm_kernel with group = D.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
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
  grid_dependency_begin();
  const int heads = hq + 2 * hkv;
  const int64_t r = blockIdx.x / heads;
  const int h = blockIdx.x % heads;
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

// L = D/16 lanes per (row, head), 32/L heads per warp; lane s of a head holds elements
// 8s … 8s + 7 (lo) and D/2 + 8s … (hi), the pairs RoPE rotates together. Every lane runs the
// shuffles (the whole warp is named), v lanes and lanes past the end included; only live q/k
// lanes store normed values, v lanes store theirs unchanged.
template <int L>
__global__ void __launch_bounds__(256)
    qk_norm_rope_store_lanes_kernel(__nv_bfloat16* q, int64_t ldq, int hq, const __nv_bfloat16* k, int64_t ldk,
                                    const __nv_bfloat16* v, int64_t ldv, int hkv, const float* q_norm,
                                    const float* k_norm, float eps, const int32_t* positions, int64_t pos0,
                                    const float* cos, const float* sin, __nv_bfloat16* k_dst, int64_t ldkd,
                                    __nv_bfloat16* v_dst, int64_t ldvd, int64_t rows) {
  constexpr int D = 16 * L, half = D / 2;
  grid_dependency_begin();
  const int heads = hq + 2 * hkv;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int s = static_cast<int>(i % L);
  const int64_t item = i / L;  // r · heads + h
  const bool live = item < rows * heads;
  const int64_t r = live ? item / heads : 0;
  const int h = live ? static_cast<int>(item % heads) : 0;
  const bool is_q = h < hq, is_v = h >= hq + hkv;
  const __nv_bfloat16* in = is_q ? q + r * ldq + int64_t(h) * D
                            : is_v ? v + r * ldv + int64_t(h - hq - hkv) * D
                                   : k + r * ldk + int64_t(h - hq) * D;
  float lo[8], hi[8];
  const uint4 ulo = *reinterpret_cast<const uint4*>(in + 8 * s), uhi = *reinterpret_cast<const uint4*>(in + half + 8 * s);
  unpack_bf16x8(ulo, lo);
  unpack_bf16x8(uhi, hi);
  const float* w = is_q ? q_norm : k_norm;
  const int64_t p = positions ? positions[r] : pos0 + r;
  float c[8], sn[8], wl[8], wh[8];
#pragma unroll
  for (int e = 0; e < 8; e += 4) {
    *reinterpret_cast<float4*>(c + e) = __ldg(reinterpret_cast<const float4*>(cos + p * half + 8 * s + e));
    *reinterpret_cast<float4*>(sn + e) = __ldg(reinterpret_cast<const float4*>(sin + p * half + 8 * s + e));
    *reinterpret_cast<float4*>(wl + e) = __ldg(reinterpret_cast<const float4*>(w + 8 * s + e));
    *reinterpret_cast<float4*>(wh + e) = __ldg(reinterpret_cast<const float4*>(w + half + 8 * s + e));
  }
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < 8; ++e) ss = fmaf(lo[e], lo[e], ss);
#pragma unroll
  for (int e = 0; e < 8; ++e) ss = fmaf(hi[e], hi[e], ss);
#pragma unroll
  for (int m = L / 2; m > 0; m /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, m);
  if (!live) return;
  if (is_v) {
    __nv_bfloat16* out = v_dst + r * ldvd + int64_t(h - hq - hkv) * D;
    *reinterpret_cast<uint4*>(out + 8 * s) = ulo;
    *reinterpret_cast<uint4*>(out + half + 8 * s) = uhi;
    return;
  }
  const float inv = rsqrtf(ss / static_cast<float>(D) + eps);
  uint32_t olo[4], ohi[4];
#pragma unroll
  for (int e = 0; e < 8; e += 2) {
    float a[2], b[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      a[u] = __bfloat162float(__float2bfloat16_rn(wl[e + u] * (lo[e + u] * inv)));
      b[u] = __bfloat162float(__float2bfloat16_rn(wh[e + u] * (hi[e + u] * inv)));
    }
    const __nv_bfloat162 x0 = __floats2bfloat162_rn(a[0] * c[e] - b[0] * sn[e], a[1] * c[e + 1] - b[1] * sn[e + 1]);
    const __nv_bfloat162 x1 = __floats2bfloat162_rn(b[0] * c[e] + a[0] * sn[e], b[1] * c[e + 1] + a[1] * sn[e + 1]);
    olo[e / 2] = *reinterpret_cast<const uint32_t*>(&x0);
    ohi[e / 2] = *reinterpret_cast<const uint32_t*>(&x1);
  }
  __nv_bfloat16* out = is_q ? q + r * ldq + int64_t(h) * D : k_dst + r * ldkd + int64_t(h - hq) * D;
  *reinterpret_cast<uint4*>(out + 8 * s) = make_uint4(olo[0], olo[1], olo[2], olo[3]);
  *reinterpret_cast<uint4*>(out + half + 8 * s) = make_uint4(ohi[0], ohi[1], ohi[2], ohi[3]);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// DFLASH_QKNR_LANES=0 keeps the block-per-head kernel everywhere (to measure against); read once.
bool lanes_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("DFLASH_QKNR_LANES");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

}  // namespace

void qk_norm_rope_store(void* q, int64_t ldq, int64_t hq, const void* k, int64_t ldk, const void* v, int64_t ldv,
                        int64_t hkv, const float* q_norm, const float* k_norm, float eps, int64_t rows,
                        int64_t head_dim, const int32_t* positions, int64_t pos0, const float* cos, const float* sin,
                        void* k_dst, int64_t ldkd, void* v_dst, int64_t ldvd, cudaStream_t s) {
  if (head_dim > 512 || head_dim % 2) throw Error("cuda qk_norm_rope_store: head_dim " + std::to_string(head_dim));
  const int64_t blocks = rows * (hq + 2 * hkv);
  if (blocks == 0) return;
  const int64_t L = head_dim / 16;
  const bool lanes = head_dim % 16 == 0 && (L & (L - 1)) == 0 && L <= 32 && (hq == 0 || rows_aligned16(q, ldq, 2)) &&
                     rows_aligned16(k, ldk, 2) && rows_aligned16(v, ldv, 2) && rows_aligned16(k_dst, ldkd, 2) &&
                     rows_aligned16(v_dst, ldvd, 2) && aligned16(q_norm) && aligned16(k_norm) && aligned16(cos) &&
                     aligned16(sin) && lanes_enabled();
  if (lanes) {
    auto launch = [&](auto kernel) {
      launch_kernel("qk_norm_rope_store", kernel, blocks_for(blocks * L, 256), 256, 0, s, static_cast<__nv_bfloat16*>(q),
                    ldq, static_cast<int>(hq), static_cast<const __nv_bfloat16*>(k), ldk,
                    static_cast<const __nv_bfloat16*>(v), ldv, static_cast<int>(hkv), q_norm, k_norm, eps, positions,
                    pos0, cos, sin, static_cast<__nv_bfloat16*>(k_dst), ldkd, static_cast<__nv_bfloat16*>(v_dst), ldvd,
                    rows);
    };
    switch (L) {
      case 1: return launch(qk_norm_rope_store_lanes_kernel<1>);
      case 2: return launch(qk_norm_rope_store_lanes_kernel<2>);
      case 4: return launch(qk_norm_rope_store_lanes_kernel<4>);
      case 8: return launch(qk_norm_rope_store_lanes_kernel<8>);
      case 16: return launch(qk_norm_rope_store_lanes_kernel<16>);
      default: return launch(qk_norm_rope_store_lanes_kernel<32>);
    }
  }
  const int threads = static_cast<int>(std::min<int64_t>(256, (head_dim + 31) / 32 * 32));
  launch_kernel("qk_norm_rope_store", qk_norm_rope_store_kernel, static_cast<unsigned>(blocks), threads, 0, s,
      static_cast<__nv_bfloat16*>(q), ldq, static_cast<int>(hq), static_cast<const __nv_bfloat16*>(k), ldk,
      static_cast<const __nv_bfloat16*>(v), ldv, static_cast<int>(hkv), q_norm, k_norm, eps,
      static_cast<int>(head_dim), positions, pos0, cos, sin, static_cast<__nv_bfloat16*>(k_dst), ldkd,
      static_cast<__nv_bfloat16*>(v_dst), ldvd);
}

}  // namespace dflash::cuda
