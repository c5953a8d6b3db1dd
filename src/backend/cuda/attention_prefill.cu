// Attention over more than kAttentionSplitMaxRows query rows (prefill): the second half of
// attention.cu's dispatch.
#include <cstdlib>
#include <string>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace dflash::cuda::attention_internal {
namespace {

constexpr int kWarps = 4;  // of the row kernel

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

// Prefill (T > kAttentionSplitMaxRows) where prefill_attention_kernel cannot run (head sizes
// other than 16, 32, 64, 96, 128, 256; unaligned rows; a build without sm_80 code): one block of kWarps
// warps per (query row, head). Keys are
// taken 32 at a time, one key per lane for the scores, then the probabilities are broadcast and
// each lane accumulates its slice of the head dimension. Each warp keeps an online softmax; the
// warps are merged at the end.
template <int EPL>
__global__ void __launch_bounds__(kWarps * 32)
    attention_kernel(const __nv_bfloat16* __restrict__ q, int64_t ldq, const __nv_bfloat16* __restrict__ k,
                     int64_t ldk, const __nv_bfloat16* __restrict__ v, int64_t ldv, __nv_bfloat16* __restrict__ out,
                     int64_t ldo, int hq, int group, int D, int64_t kv_len, int64_t q_pos0, bool causal,
                     float scale_log2, bool vec) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float warp_m[kWarps], warp_l[kWarps];
  __shared__ float warp_acc[kWarps][kMaxHeadDim];
  grid_dependency_begin();
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

// Prefill on the tensor cores (sm_80+, D ∈ {16, 32, 64, 96, 128, 256}, 16-byte aligned K/V rows):
// flash attention. A unit is 16 query rows of one head; units are ordered by row tile, then by
// head of the GQA group, and the W warps of a block (kPrefillWarps) take consecutive units of one
// KV head, so each tile of prefill_keys<D>() keys staged in shared memory (double-buffered, through
// asynchronous copies) serves every head of the group. Scores and P·V run as in
// split_chunk_mma (P split into bf16 hi + lo parts, so P·V keeps about f32 accuracy); the
// softmax is online over the tiles, each row's max and sum held by the four lanes of its quad.
// Prefill rows need not equal decode rows bit for bit (they feed the cache, not a comparison),
// so this path is free to tile by T. The one-block-per-(row, head) kernel above took 0.45 ms
// for 512 rows at Qwen3-8B's heads (H200, 2026-11-29): it re-read every key once per query.
// Eight units a block: each K/V tile staged serves 128 queries. Against four (64 queries a
// tile): 512 / 2048 / 8192 tokens 12.62 / 53.46 / 287.6 against 13.26 / 54.72 / 308.9 ms, one
// run, H200, 2026-12-01 (likely from halving the K/V bytes each query pulls from L2; not
// measured apart). 245 registers a thread: one block an SM, the same eight warps as two of four.
constexpr int kPrefillWarps = 8;
constexpr int kPrefillRows = 16;  // query rows of a unit: one m16 tile
// Keys a K/V tile holds. At head_dim 256 a warp's queries (64 registers) and output (128) leave
// room for the scores of 32 keys only (255 registers and an 8-byte spill with the lo part; 16
// keys a tile spill as much).
template <int D>
__host__ __device__ constexpr int prefill_keys() {
  return D > 128 ? 32 : 64;
}

struct PrefillArgs : AttentionOperands {
  int64_t units;  // per KV head: group · ⌈T / 16⌉
  int hkv;
};

template <int D>
constexpr size_t prefill_smem_bytes() {
  return size_t(2) * 2 * prefill_keys<D>() * (D + 8) * sizeof(__nv_bfloat16);  // K and V, two stages
}

template <int D, bool LO, int W = kPrefillWarps>
__global__ void __launch_bounds__(W * 32) prefill_attention_kernel(const PrefillArgs a) {
  static_assert(D % 16 == 0 && D <= 256, "whole k16 steps; the accumulators of D > 256 would spill");
  constexpr int kPrefillKeys = prefill_keys<D>();
  constexpr int Dp = D + 8;  // the pad staggers rows across banks for the fragment loads
  constexpr int KS = D / 16, DT = D / 8, NT = kPrefillKeys / 8, SEGS = D / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  auto* Ks = reinterpret_cast<__nv_bfloat16*>(smem);  // [2][kPrefillKeys][Dp]
  __nv_bfloat16* Vs = Ks + 2 * kPrefillKeys * Dp;

  // The last row tiles see the most keys: their blocks go first.
  const int64_t b = int64_t(gridDim.x) - 1 - blockIdx.x;
  const int kvh = static_cast<int>(b % a.hkv);
  const int64_t unit0 = b / a.hkv * W;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  auto visible = [&](int64_t row) {  // keys row sees (rows past T count as the last row)
    const int64_t r = row < a.T ? row : a.T - 1;
    return a.causal && a.q_pos0 + r + 1 < a.kv_len ? a.q_pos0 + r + 1 : a.kv_len;
  };
  const int64_t last_unit = min(unit0 + W, a.units) - 1;
  const int64_t n_keys = visible((last_unit / a.group) * kPrefillRows + kPrefillRows - 1);
  const int64_t unit = unit0 + warp;
  const bool active = unit < a.units;
  const int64_t t0 = active ? unit / a.group * kPrefillRows : 0;
  const int h = kvh * a.group + static_cast<int>(active ? unit % a.group : 0);
  const int64_t warp_keys = active ? visible(t0 + kPrefillRows - 1) : 0;
  const int64_t vis[2] = {visible(t0 + g), visible(t0 + g + 8)};

  grid_dependency_begin();
  auto stage = [&](int64_t j0, int buf) {
    __nv_bfloat16* kd = Ks + buf * kPrefillKeys * Dp;
    __nv_bfloat16* vd = Vs + buf * kPrefillKeys * Dp;
    for (int i = threadIdx.x; i < kPrefillKeys * SEGS; i += W * 32) {
      const int r = i / SEGS, s8 = (i % SEGS) * 8;
      const int64_t j = j0 + r;
      if (j < n_keys) {
        cp_async16(kd + r * Dp + s8, a.k + j * a.ldk + int64_t(kvh) * D + s8);
        cp_async16(vd + r * Dp + s8, a.v + j * a.ldv + int64_t(kvh) * D + s8);
      } else {  // zeros: a probability of exactly 0 must not meet a NaN past the cache
        *reinterpret_cast<uint4*>(kd + r * Dp + s8) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(vd + r * Dp + s8) = make_uint4(0, 0, 0, 0);
      }
    }
    cp_async_commit();
  };
  stage(0, 0);

  // The warp's queries as A fragments, for the whole loop (rows past T re-read the last row).
  uint32_t qf[KS][4];
  {
    const __nv_bfloat16* q0 = a.q + min(t0 + g, a.T - 1) * a.ldq + int64_t(h) * D + 2 * t;
    const __nv_bfloat16* q1 = a.q + min(t0 + g + 8, a.T - 1) * a.ldq + int64_t(h) * D + 2 * t;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      qf[ks][0] = active ? *reinterpret_cast<const uint32_t*>(q0 + ks * 16) : 0u;
      qf[ks][1] = active ? *reinterpret_cast<const uint32_t*>(q1 + ks * 16) : 0u;
      qf[ks][2] = active ? *reinterpret_cast<const uint32_t*>(q0 + ks * 16 + 8) : 0u;
      qf[ks][3] = active ? *reinterpret_cast<const uint32_t*>(q1 + ks * 16 + 8) : 0u;
    }
  }

  float o[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int i = 0; i < 4; ++i) o[dt][i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  const int64_t tiles = (n_keys + kPrefillKeys - 1) / kPrefillKeys;
  for (int64_t it = 0; it < tiles; ++it) {
    if (it + 1 < tiles) {
      stage((it + 1) * kPrefillKeys, int((it + 1) & 1));
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int64_t j0 = it * kPrefillKeys;
    if (j0 < warp_keys) {  // warp-uniform; every row sees key 0, so m is finite after tile 0
      const __nv_bfloat16* Kb = Ks + int(it & 1) * kPrefillKeys * Dp;
      const __nv_bfloat16* Vb = Vs + int(it & 1) * kPrefillKeys * Dp;
      float s[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[nt][i] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const __nv_bfloat16* kr = Kb + (nt * 8 + g) * Dp + ks * 16 + 2 * t;
          mma_bf16_16x8x16(s[nt], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3],
                           *reinterpret_cast<const uint32_t*>(kr), *reinterpret_cast<const uint32_t*>(kr + 8));
        }
      // Accumulator i of tile nt is row g + 8·(i / 2), key j0 + 8·nt + 2t + i % 2.
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t j = j0 + nt * 8 + 2 * t + i % 2;
          s[nt][i] = j < vis[i / 2] ? s[nt][i] * a.scale_log2 : -INFINITY;
          mx[i / 2] = fmaxf(mx[i / 2], s[nt][i]);
        }
      float corr[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float mn = fmaxf(m[r], mx[r]);
        corr[r] = exp2f(m[r] - mn);
        m[r] = mn;
        l[r] *= corr[r];
      }
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int i = 0; i < 4; ++i) o[dt][i] *= corr[i / 2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[nt][i] = exp2f(s[nt][i] - m[i / 2]);
          l[i / 2] += s[nt][i];
        }
      // P·V, keys 16·kk … 16·kk + 15 a step: the scores' accumulators of tiles 2kk and 2kk + 1
      // are the A fragment's layout; V's B fragments for two n8 tiles from one transposed ldmatrix.
#pragma unroll
      for (int kk = 0; kk < kPrefillKeys / 16; ++kk) {
        uint32_t hi[4], lo[4];
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          const float* p = &s[2 * kk + f / 2][(f % 2) * 2];
          const __nv_bfloat162 ph = __floats2bfloat162_rn(p[0], p[1]);
          const __nv_bfloat162 pl = __floats2bfloat162_rn(p[0] - __low2float(ph), p[1] - __high2float(ph));
          hi[f] = bf16_pair_bits(ph);
          lo[f] = bf16_pair_bits(pl);
        }
        // A registers: 0 = (row g, keys 2t…), 1 = (row g + 8, keys 2t…), 2 = (row g, keys 2t + 8…),
        // 3 = (row g + 8, keys 2t + 8…); f above runs (tile 2kk rows g, g + 8; tile 2kk + 1 …).
        const int mi = lane / 8;
#pragma unroll
        for (int dt = 0; dt < DT; dt += 2) {
          uint32_t bv[4];
          ldmatrix_trans(bv, Vb + (kk * 16 + lane % 8 + 8 * (mi & 1)) * Dp + (dt + (mi >> 1)) * 8, true);
          mma_bf16_16x8x16(o[dt], hi[0], hi[1], hi[2], hi[3], bv[0], bv[1]);
          if constexpr (LO) mma_bf16_16x8x16(o[dt], lo[0], lo[1], lo[2], lo[3], bv[0], bv[1]);
          mma_bf16_16x8x16(o[dt + 1], hi[0], hi[1], hi[2], hi[3], bv[2], bv[3]);
          if constexpr (LO) mma_bf16_16x8x16(o[dt + 1], lo[0], lo[1], lo[2], lo[3], bv[2], bv[3]);
        }
      }
    }
    __syncthreads();  // the next stage overwrites this buffer
  }

  if (!active) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int64_t row = t0 + g + 8 * r;
    if (row >= a.T) continue;
    const float inv = 1.f / l[r];
    __nv_bfloat16* dst = a.out + row * a.ldo + int64_t(h) * D + 2 * t;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8) = __floats2bfloat162_rn(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
  }
}

// Measuring only, read once: DFLASH_ATTN_PREFILL=rows keeps the one-block-per-(row, head)
// kernel, =bf16p the tensor-core kernel with P·V from bf16 probabilities alone (no lo part, as
// FlashAttention does): 6 % faster at 8192 tokens, 2 % at 512, relative L2 from the CPU 1.8e-3
// against 1.6e-3 (H200, 2026-12-01); the default keeps the split path's accuracy.
const std::string& prefill_setting() {
  static const std::string v = [] {
    const char* e = std::getenv("DFLASH_ATTN_PREFILL");
    return std::string(e ? e : "");
  }();
  return v;
}

// Whether prefill runs on the tensor cores (prefill_attention_kernel): sm_80+ code in this binary.
bool prefill_mma_enabled() {
  static const bool enabled = [] {
    if (prefill_setting() == "rows") return false;
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, prefill_attention_kernel<128, true>) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attr.ptxVersion >= 80 && attr.binaryVersion >= 80;
  }();
  return enabled;
}

// Measuring only, read once: DFLASH_ATTN_PREFILL_WARPS=4 gives a block four units (half the
// queries for each K/V tile staged) instead of kPrefillWarps.
int prefill_warps() {
  static const int w = [] {
    const char* e = std::getenv("DFLASH_ATTN_PREFILL_WARPS");
    return e && std::atoi(e) == 4 ? 4 : kPrefillWarps;
  }();
  return w;
}

template <int D, int W>
void launch_prefill_warps(const PrefillArgs& a, cudaStream_t s) {
  // Two stages of K and V: 68 KiB at D = 128, above the 48 KiB a kernel gets without opting in.
  static const cudaError_t opt_in = [] {
    for (auto* k : {prefill_attention_kernel<D, true, W>, prefill_attention_kernel<D, false, W>})
      if (const cudaError_t e =
              cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(prefill_smem_bytes<D>())))
        return e;
    return cudaSuccess;
  }();
  check(opt_in, "attention", "cudaFuncSetAttribute (dynamic shared memory)");
  const int64_t blocks = (a.units + W - 1) / W * a.hkv;
  launch_kernel("attention",
                prefill_setting() == "bf16p" ? prefill_attention_kernel<D, false, W> : prefill_attention_kernel<D, true, W>,
                static_cast<unsigned>(blocks), W * 32, prefill_smem_bytes<D>(), s, a);
}

template <int D>
void launch_prefill(const PrefillArgs& a, cudaStream_t s) {
  if (prefill_warps() == 4) launch_prefill_warps<D, 4>(a, s);
  else launch_prefill_warps<D, kPrefillWarps>(a, s);
}

}  // namespace

void prefill_attention(const AttentionOperands& o, int64_t hq, int64_t hkv, int D, bool vec, cudaStream_t s) {
  // 32-bit query loads and output stores: even strides and 4-byte aligned bases.
  const bool pairs = o.ldq % 2 == 0 && o.ldo % 2 == 0 && reinterpret_cast<uintptr_t>(o.q) % 4 == 0 &&
                     reinterpret_cast<uintptr_t>(o.out) % 4 == 0;
  if (vec && pairs && o.kv_len > 0 && (D == 16 || D == 32 || D == 64 || D == 96 || D == 128 || D == 256) &&
      prefill_mma_enabled()) {
    PrefillArgs a{};
    static_cast<AttentionOperands&>(a) = o;
    a.units = int64_t(o.group) * ((o.T + kPrefillRows - 1) / kPrefillRows);
    a.hkv = static_cast<int>(hkv);
    if (D == 16) launch_prefill<16>(a, s);
    else if (D == 32) launch_prefill<32>(a, s);
    else if (D == 64) launch_prefill<64>(a, s);
    else if (D == 96) launch_prefill<96>(a, s);
    else if (D == 128) launch_prefill<128>(a, s);
    else launch_prefill<256>(a, s);
    return;
  }

  const unsigned blocks = static_cast<unsigned>(o.T * hq);
  auto launch = [&](auto kernel) {
    launch_kernel("attention", kernel, blocks, kWarps * 32, 0, s, o.q, o.ldq, o.k, o.ldk, o.v, o.ldv, o.out, o.ldo,
                  static_cast<int>(hq), o.group, D, o.kv_len, o.q_pos0, o.causal, o.scale_log2, vec);
  };
  if (D <= 32) launch(attention_kernel<1>);
  else if (D <= 64) launch(attention_kernel<2>);
  else if (D <= 128) launch(attention_kernel<4>);
  else launch(attention_kernel<8>);
}

}  // namespace dflash::cuda::attention_internal
