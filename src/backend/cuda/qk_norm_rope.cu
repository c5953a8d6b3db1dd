// Qwen3's per-head q/k RMSNorm, RoPE and the KV-cache store in one launch (they were six:
// two norms, two ropes, two copies, each a few microseconds of launch for a few KB of data).
// One block per (row, head) of q, k and v; the arithmetic and roundings are those of the
// separate kernels (norm in f32, round to bf16, rotate in f32, round), so results equal the
// unfused path's bit for bit.
#include <algorithm>
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

// The same op for blocks of rows, one warp per (row, head) instead of one block: a block
// each made 24576 blocks of 128 threads for a 512-row prompt at Qwen3-8B's heads (34 µs, H200).
// Lane l holds elements l + 32·w, w < D / 32, so the sum of squares is taken as the block kernel
// takes it (one butterfly per group of 32 elements, the groups' totals added in order from 0)
// and the rotation's pairs j, j + D/2 sit in one lane (D % 64 == 0): the same numbers as
// qk_norm_rope_store_kernel, with the launch's block count divided by eight.
constexpr int kRowWarps = 8;

// One head of one row by one warp (lane l holds elements l + 32·w): out ← rope(rms_norm(in; nw))
// at position p. in may be out (q is rotated in place): every lane reads its elements first.
template <int D>
__device__ __forceinline__ void norm_rope_head_warp(const __nv_bfloat16* in, __nv_bfloat16* out, const float* nw,
                                                    float eps, int64_t p, const float* cos, const float* sin,
                                                    int lane) {
  static_assert(D % 64 == 0 && D <= 256, "rotation pairs in one lane; the block kernel's one element a thread");
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
  for (int w = 0; w < W; ++w) normed[w] = __bfloat162float(__float2bfloat16_rn(nw[lane + 32 * w] * (x[w] * inv)));
#pragma unroll
  for (int w = 0; w < W / 2; ++w) {
    const int j = lane + 32 * w;
    const float c = cos[p * HALF + j], s = sin[p * HALF + j];
    const float a = normed[w], b = normed[w + W / 2];
    out[j] = __float2bfloat16_rn(a * c - b * s);
    out[j + HALF] = __float2bfloat16_rn(b * c + a * s);
  }
}

template <int D>
__device__ __forceinline__ void copy_head_warp(const __nv_bfloat16* in, __nv_bfloat16* out, int lane) {
#pragma unroll
  for (int w = 0; w < D / 32; ++w) out[lane + 32 * w] = in[lane + 32 * w];
}

template <int D>
__global__ void __launch_bounds__(kRowWarps * 32)
    qk_norm_rope_store_warps_kernel(__nv_bfloat16* q, int64_t ldq, int hq, const __nv_bfloat16* k, int64_t ldk,
                                    const __nv_bfloat16* v, int64_t ldv, int hkv, const float* q_norm,
                                    const float* k_norm, float eps, int64_t rows, const int32_t* positions,
                                    int64_t pos0, const float* cos, const float* sin, __nv_bfloat16* k_dst,
                                    int64_t ldkd, __nv_bfloat16* v_dst, int64_t ldvd) {
  grid_dependency_begin();
  const int heads = hq + 2 * hkv, lane = threadIdx.x % 32;
  const int64_t unit = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (unit >= rows * heads) return;
  const int64_t r = unit / heads;
  const int h = static_cast<int>(unit % heads);
  if (h >= hq + hkv) {
    const int hv = h - hq - hkv;
    copy_head_warp<D>(v + r * ldv + int64_t(hv) * D, v_dst + r * ldvd + int64_t(hv) * D, lane);
    return;
  }
  const bool is_q = h < hq;
  const __nv_bfloat16* in = is_q ? q + r * ldq + int64_t(h) * D : k + r * ldk + int64_t(h - hq) * D;
  __nv_bfloat16* out = is_q ? q + r * ldq + int64_t(h) * D : k_dst + r * ldkd + int64_t(h - hq) * D;
  norm_rope_head_warp<D>(in, out, is_q ? q_norm : k_norm, eps, positions ? positions[r] : pos0 + r, cos, sin, lane);
}

// kv_norm_rope_store: the warps kernel without q for up to kMaxKvLayers layers at once, layer
// blockIdx.y; the same function of each head, so the same numbers as a launch a layer.
struct KvLayersArgs {
  KvLayerRows layer[kMaxKvLayers];
};

template <int D>
__global__ void __launch_bounds__(kRowWarps * 32)
    kv_norm_rope_store_kernel(const KvLayersArgs a, int hkv, float eps, int64_t rows, const int32_t* positions,
                              int64_t pos0, const float* cos, const float* sin) {
  grid_dependency_begin();
  const KvLayerRows& L = a.layer[blockIdx.y];
  const int lane = threadIdx.x % 32;
  const int64_t unit = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (unit >= rows * 2 * hkv) return;
  const int64_t r = unit / (2 * hkv);
  const int h = static_cast<int>(unit % (2 * hkv));
  const auto* k = static_cast<const __nv_bfloat16*>(L.k);
  const auto* v = static_cast<const __nv_bfloat16*>(L.v);
  auto* k_dst = static_cast<__nv_bfloat16*>(L.k_dst);
  auto* v_dst = static_cast<__nv_bfloat16*>(L.v_dst);
  if (h >= hkv) {
    copy_head_warp<D>(v + r * L.ldv + int64_t(h - hkv) * D, v_dst + r * L.ldvd + int64_t(h - hkv) * D, lane);
    return;
  }
  norm_rope_head_warp<D>(k + r * L.ldk + int64_t(h) * D, k_dst + r * L.ldkd + int64_t(h) * D, L.k_norm, eps,
                         positions ? positions[r] : pos0 + r, cos, sin, lane);
}

}  // namespace

void qk_norm_rope_store(void* q, int64_t ldq, int64_t hq, const void* k, int64_t ldk, const void* v, int64_t ldv,
                        int64_t hkv, const float* q_norm, const float* k_norm, float eps, int64_t rows,
                        int64_t head_dim, const int32_t* positions, int64_t pos0, const float* cos, const float* sin,
                        void* k_dst, int64_t ldkd, void* v_dst, int64_t ldvd, cudaStream_t s) {
  if (head_dim > 512 || head_dim % 2) throw Error("cuda qk_norm_rope_store: head_dim " + std::to_string(head_dim));
  const int64_t blocks = rows * (hq + 2 * hkv);
  if (blocks == 0) return;
  // Both kernels give the same numbers. A decode row keeps the block kernel; blocks of rows
  // (verification, drafting, prompts) take the warps kernel: at Qwen3-8B shapes a DFlash step
  // is 0.6 % shorter at 512 cached rows (level at 4096) than with the block kernel's block per
  // row and head (768 for 16 rows), and plain decode is level with either kernel for its one
  // row (H200, 2026-12-02, docs/benchmarks.md thirty-second pass). DFLASH_QKNORM_WARPS_ROWS=R
  // (measuring only): the warps kernel from R rows on (33: as before that pass).
  static const int64_t warps_from = [] {
    const char* e = std::getenv("DFLASH_QKNORM_WARPS_ROWS");
    return e && std::atoll(e) > 0 ? std::atoll(e) : int64_t(2);
  }();
  if (rows >= warps_from && (head_dim == 64 || head_dim == 128 || head_dim == 256)) {
    auto launch = [&](auto kernel) {
      launch_kernel("qk_norm_rope_store", kernel, blocks_for(blocks, kRowWarps), kRowWarps * 32, 0, s,
          static_cast<__nv_bfloat16*>(q), ldq, static_cast<int>(hq), static_cast<const __nv_bfloat16*>(k), ldk,
          static_cast<const __nv_bfloat16*>(v), ldv, static_cast<int>(hkv), q_norm, k_norm, eps, rows, positions,
          pos0, cos, sin, static_cast<__nv_bfloat16*>(k_dst), ldkd, static_cast<__nv_bfloat16*>(v_dst), ldvd);
    };
    if (head_dim == 64) launch(qk_norm_rope_store_warps_kernel<64>);
    else if (head_dim == 128) launch(qk_norm_rope_store_warps_kernel<128>);
    else launch(qk_norm_rope_store_warps_kernel<256>);
    return;
  }
  const int threads = static_cast<int>(std::min<int64_t>(256, (head_dim + 31) / 32 * 32));
  launch_kernel("qk_norm_rope_store", qk_norm_rope_store_kernel, static_cast<unsigned>(blocks), threads, 0, s,
      static_cast<__nv_bfloat16*>(q), ldq, static_cast<int>(hq), static_cast<const __nv_bfloat16*>(k), ldk,
      static_cast<const __nv_bfloat16*>(v), ldv, static_cast<int>(hkv), q_norm, k_norm, eps,
      static_cast<int>(head_dim), positions, pos0, cos, sin, static_cast<__nv_bfloat16*>(k_dst), ldkd,
      static_cast<__nv_bfloat16*>(v_dst), ldvd);
}

bool kv_norm_rope_store_applies(int64_t layers, int64_t head_dim) {
  return layers >= 1 && layers <= kMaxKvLayers && (head_dim == 64 || head_dim == 128 || head_dim == 256);
}

void kv_norm_rope_store(const KvLayerRows* layers, int64_t n_layers, int64_t hkv, float eps, int64_t rows,
                        int64_t head_dim, const int32_t* positions, int64_t pos0, const float* cos, const float* sin,
                        cudaStream_t s) {
  if (!kv_norm_rope_store_applies(n_layers, head_dim))
    throw Error("cuda kv_norm_rope_store: " + std::to_string(n_layers) + " layers of head_dim " +
                std::to_string(head_dim));
  if (rows * hkv == 0) return;
  KvLayersArgs a{};
  for (int64_t l = 0; l < n_layers; ++l) a.layer[l] = layers[l];
  const dim3 grid(blocks_for(rows * 2 * hkv, kRowWarps), static_cast<unsigned>(n_layers));
  auto launch = [&](auto kernel) {
    launch_kernel("qk_norm_rope_store", kernel, grid, kRowWarps * 32, 0, s, a, static_cast<int>(hkv), eps, rows,
                  positions, pos0, cos, sin);
  };
  if (head_dim == 64) launch(kv_norm_rope_store_kernel<64>);
  else if (head_dim == 128) launch(kv_norm_rope_store_kernel<128>);
  else launch(kv_norm_rope_store_kernel<256>);
}

}  // namespace dflash::cuda
