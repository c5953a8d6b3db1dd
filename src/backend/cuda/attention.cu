// Attention for prefill, verification and the drafter's block: one block of kWarps warps per
// (query row, head). Keys are taken 32 at a time, one key per lane for the scores (so a warp
// has 32 independent row loads in flight, which a decode step with few queries needs), then
// the probabilities are broadcast and each lane accumulates its slice of the head dimension.
// Each warp keeps an online softmax over its chunks; the warps are merged at the end. The
// order of every sum depends only on the query and kv_len, never on how many queries share
// the launch: one row verified in a block equals the same row decoded alone.
#include <cmath>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace dflash::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxHeadDim = 256;

// EPL = elements of the head dimension per lane (head_dim ≤ 32 · EPL).
template <int EPL>
__device__ __forceinline__ void load_slice(const __nv_bfloat16* row, int d0, int D, bool vec, float (&f)[EPL]) {
  if (vec && d0 + EPL <= D) {
    if constexpr (EPL == 8) {
      unpack_bf16x8(*reinterpret_cast<const uint4*>(row + d0), f);
      return;
    } else if constexpr (EPL == 4) {
      const uint2 u = *reinterpret_cast<const uint2*>(row + d0);
      f[0] = __uint_as_float(u.x << 16);
      f[1] = __uint_as_float(u.x & 0xffff0000u);
      f[2] = __uint_as_float(u.y << 16);
      f[3] = __uint_as_float(u.y & 0xffff0000u);
      return;
    } else if constexpr (EPL == 2) {
      const uint32_t u = *reinterpret_cast<const uint32_t*>(row + d0);
      f[0] = __uint_as_float(u << 16);
      f[1] = __uint_as_float(u & 0xffff0000u);
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < EPL; ++e) f[e] = d0 + e < D ? __bfloat162float(row[d0 + e]) : 0.f;
}

template <int EPL>
__global__ void __launch_bounds__(kWarps * 32)
    attention_kernel(const __nv_bfloat16* __restrict__ q, int64_t ldq, const __nv_bfloat16* __restrict__ k,
                     int64_t ldk, const __nv_bfloat16* __restrict__ v, int64_t ldv, __nv_bfloat16* __restrict__ out,
                     int64_t ldo, int hq, int group, int D, int64_t kv_len, int64_t q_pos0, bool causal,
                     float scale_log2, bool vec) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float warp_m[kWarps], warp_l[kWarps];
  __shared__ float warp_acc[kWarps][kMaxHeadDim];
  const int64_t t = blockIdx.x / hq;
  const int h = blockIdx.x % hq, kvh = h / group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // The scale and log2(e) are folded into q once, so the softmax runs on exp2.
  for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = __bfloat162float(q[t * ldq + int64_t(h) * D + d]) * scale_log2;
  __syncthreads();

  const int64_t visible = causal && q_pos0 + t + 1 < kv_len ? q_pos0 + t + 1 : kv_len;
  const __nv_bfloat16* kb = k + int64_t(kvh) * D;
  const __nv_bfloat16* vb = v + int64_t(kvh) * D;
  const int d0 = lane * EPL;
  float m = -INFINITY, l = 0.f, acc[EPL];
#pragma unroll
  for (int e = 0; e < EPL; ++e) acc[e] = 0.f;

  for (int64_t base = int64_t(warp) * 32; base < visible; base += kWarps * 32) {
    const int64_t j = base + lane;
    float s = -INFINITY;
    if (j < visible) {
      const __nv_bfloat16* kr = kb + j * ldk;
      float dot = 0.f;
      if (vec) {
#pragma unroll 4
        for (int d = 0; d < D; d += 8) {
          float f[8];
          unpack_bf16x8(*reinterpret_cast<const uint4*>(kr + d), f);
#pragma unroll
          for (int e = 0; e < 8; ++e) dot = fmaf(qs[d + e], f[e], dot);
        }
      } else {
        for (int d = 0; d < D; ++d) dot = fmaf(qs[d], __bfloat162float(kr[d]), dot);
      }
      s = dot;
    }
    // base < visible, so lane 0's key is real and the chunk maximum is finite.
    const float mn = fmaxf(m, warp_max(s));
    const float corr = exp2f(m - mn);
    const float p = exp2f(s - mn);
    l = l * corr + p;
#pragma unroll
    for (int e = 0; e < EPL; ++e) acc[e] *= corr;
    const int n = visible - base < 32 ? static_cast<int>(visible - base) : 32;
    for (int jj = 0; jj < n; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      float f[EPL];
      load_slice<EPL>(vb + (base + jj) * ldv, d0, D, vec, f);
#pragma unroll
      for (int e = 0; e < EPL; ++e) acc[e] = fmaf(pj, f[e], acc[e]);
    }
    m = mn;
  }
  l = warp_sum(l);
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < EPL; ++e)
    if (d0 + e < D) warp_acc[warp][d0 + e] = acc[e];
  __syncthreads();

  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, warp_m[w]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.f, den = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = warp_m[w] == -INFINITY ? 0.f : exp2f(warp_m[w] - M);  // a warp that saw no key
      num = fmaf(warp_acc[w][d], f, num);
      den = fmaf(warp_l[w], f, den);
    }
    out[t * ldo + int64_t(h) * D + d] = __float2bfloat16_rn(visible > 0 ? num / den : 0.f);
  }
}

}  // namespace

void attention(const void* q, int64_t ldq, const void* k, int64_t ldk, const void* v, int64_t ldv, void* out,
               int64_t ldo, int64_t T, int64_t hq, int64_t hkv, int64_t head_dim, int64_t kv_len, int64_t q_pos0,
               bool causal, cudaStream_t s) {
  if (head_dim > kMaxHeadDim) throw Error("cuda attention: head_dim " + std::to_string(head_dim) + " > 256");
  if (T * hq == 0) return;
  const float scale_log2 = 1.4426950408889634f / std::sqrt(static_cast<float>(head_dim));
  // 16-byte key loads need head_dim % 8 == 0 and 16-byte aligned rows and bases.
  auto aligned = [](const void* p, int64_t ld) { return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld % 8 == 0; };
  const bool vec = head_dim % 8 == 0 && aligned(k, ldk) && aligned(v, ldv);
  const auto* qp = static_cast<const __nv_bfloat16*>(q);
  const auto* kp = static_cast<const __nv_bfloat16*>(k);
  const auto* vp = static_cast<const __nv_bfloat16*>(v);
  auto* op = static_cast<__nv_bfloat16*>(out);
  const unsigned blocks = static_cast<unsigned>(T * hq);
  const int group = static_cast<int>(hq / hkv), D = static_cast<int>(head_dim);
  auto launch = [&](auto kernel) {
    kernel<<<blocks, kWarps * 32, 0, s>>>(qp, ldq, kp, ldk, vp, ldv, op, ldo, static_cast<int>(hq), group, D, kv_len,
                                          q_pos0, causal, scale_log2, vec);
  };
  if (head_dim <= 32) launch(attention_kernel<1>);
  else if (head_dim <= 64) launch(attention_kernel<2>);
  else if (head_dim <= 128) launch(attention_kernel<4>);
  else launch(attention_kernel<8>);
  check_launch("attention");
}

}  // namespace dflash::cuda
