#pragma once
// The tensor-core skinny product's block (skinny_matmul.cu has the file comment on how it
// computes and why every output keeps its bits whatever M is), shared by its own kernel and by
// the fused decoder layer (fused_layer.cu). Device code: include from .cu files only.
#include <type_traits>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/swiglu.cuh"

namespace dflash::cuda::skinny {

constexpr int kWarps = 8;

// ---------------------------------------------------------------------------------------------
// Tensor-core kernel.
//
// A warp owns NT·8 rows of w (NT n8 tiles) and a contiguous slice of K, which it walks in
// chunks of 32. In a chunk, lane (g, t) loads 16 bytes of weight row g of each tile, elements
// 8t … 8t+7, and hands them to two mma's as B fragments: registers 0-1 to the first, 2-3 to
// the second. That is the mma's k order permuted: logical k (2t, 2t+1 | 2t+8, 2t+9) of mma j
// is physical k 8t + 4j + (0, 1 | 2, 3) of the chunk. The A fragments (x) are loaded with the
// same permutation, two 16-byte loads per lane and m16 tile (rows g and g+8, elements
// 8t … 8t+7), so every product x[m, k]·w[n, k] is formed exactly once, and output (m, n)
// accumulates its chunks in ascending order, mma 0 before mma 1, whatever M is. Rows of x at or
// past M are zeros in registers (not loaded); they change nothing in the other rows, since an
// mma computes each row of its result from that row of A alone.
//
// Weights are loaded U chunks at a time (U·NT 16-byte loads per lane), and the next batch is
// issued before the current one is used, so up to 2·U·NT loads per lane are in flight. They
// bypass L1; x goes through L1, where the warps of a block and of the blocks sharing an SM
// find it.
//
// The S warps of a block that share the same rows of w split K into S slices; their partial
// sums meet in shared memory and are added in slice order 0, 1, …, S−1. S (1, 2, 4 or 8) and NT
// come from N and K only, so a given weight matrix is always reduced the same way.
constexpr int kTargetWarps = 2048;   // ≈ 132 SMs × 16 warps: enough loads in flight for HBM3e
constexpr int kMinSliceChunks = 8;   // a K slice of at least 256 elements per warp

// x's 16-byte loads: through the read-only path when x is older than the kernel, else from L2
// (coherent with what other blocks stored before the last grid barrier).
template <bool X_NC>
__device__ __forceinline__ uint4 load_x(const uint4* p) {
  if constexpr (X_NC) return __ldg(p);
  else return __ldcg(p);  // global, through L2 (a plain load of a pointer from memory is generic)
}

// What the epilogue does besides storing y (the deferred RMSNorm, SkinnyNorm in kernels.h).
enum Epilogue : int {
  kEpiPlain = 0,
  kEpiEmitNorm = 1,  // y is the f32 residual: also h = bf16(norm_w ⊙ y) and Σ y² per row over the block's columns
  kEpiScaleInv = 2,  // each output times its row's 1/rms, from the partial sums an emitting product wrote
  // The three above chosen per launch from SkinnyMmaArgs (epi, pair, y_f32) instead of per
  // instantiation: one copy of the main loop serves every product of the fused decoder layer
  // (fused_layer.cu), where several copies in one kernel would compete for its registers.
  kEpiRuntime = -1,
};

// PAIR (NT == 2): w is [gate; up], 2·NO rows; a warp's two n8 tiles are gate rows n0 … n0+7
// and up rows NO + n0 … NO + n0 + 7, and the epilogue stores y[m, n] = silu(gate)·up for its
// 8 columns, each product first rounded to bf16 as the unfused gate_up tensor would hold it.
// Every product sums its K slices exactly as the plain kernel does (same chunks, same order,
// S from the same weight shape), so this equals matmul + silu_mul bit for bit.
//
// skinny_mma_block is one block's work, `block` standing for the block index, so that the same
// instructions run as a kernel of their own (skinny_matmul.cu) and as a stage of the fused
// decoder layer (fused_layer.cu). `wait` is where the block waits for the work its inputs come
// from (the kernel before it, or the stage before it). X_NC: x may be read through the
// read-only path, true only when x was written before this kernel began.
struct SkinnyMmaArgs {
  const __nv_bfloat16* x;
  int64_t ldx;
  const __nv_bfloat16* w;
  int64_t ldw;
  void* y;
  int64_t ldy;
  int M, N, K, S;
  bool accumulate;
  SkinnyNorm norm;
  bool w_uploaded, early_y;
  int epi;      // kEpiRuntime only: the epilogue
  bool pair;    // kEpiRuntime only: a gate/up pair
  bool y_f32;   // kEpiRuntime only: y is f32 (else bf16)
};

// Shared memory of a block, in floats: the warps' partial sums, each row's 1/rms, each row's
// squares (emitting products); `sbuf` below points at that many.
template <int MT, int NT, int EPI, bool PAIR>
__host__ __device__ constexpr int skinny_smem_floats() {
  constexpr int kRows = NT * 8, kCols = PAIR ? 8 : kRows;
  return kWarps * MT * 16 * kRows + MT * 16 + (EPI == kEpiEmitNorm ? MT * 16 * kWarps * kCols : 0);
}

template <int MT, int NT, typename Out, int EPI, bool PAIR, bool X_NC, int XU_MAX = 4, typename Wait>
__device__ __forceinline__ void skinny_mma_block(const SkinnyMmaArgs& args, int block, float* sbuf, Wait&& wait) {
  const __nv_bfloat16* __restrict__ x = args.x;
  const __nv_bfloat16* __restrict__ w = args.w;
  constexpr bool kRt = EPI == kEpiRuntime;
  using OutT = std::conditional_t<kRt, float, Out>;  // a placeholder type when kRt
  OutT* __restrict__ y = static_cast<OutT*>(args.y);
  const int64_t ldx = args.ldx, ldw = args.ldw, ldy = args.ldy;
  const int M = args.M, N = args.N, K = args.K, S = args.S;
  const bool accumulate = args.accumulate, w_uploaded = args.w_uploaded, early_y = args.early_y;
  const SkinnyNorm& norm = args.norm;
  static_assert(kRt || EPI != kEpiEmitNorm || (!PAIR && std::is_same_v<Out, float>), "the residual stream is f32");
  constexpr int U = 8 / NT;  // chunks per batch: eight 16-byte weight loads per lane
  static_assert(!PAIR || NT == 2, "a gate/up pair is two n8 tiles");
  // The epilogue's choices: compile-time constants unless kRt.
  const int epi = kRt ? args.epi : EPI;
  const bool pair = kRt ? args.pair : PAIR;
  const bool emit = epi == kEpiEmitNorm, scale_inv = epi == kEpiScaleInv;
  constexpr int kRows = NT * 8;                  // rows of w per warp
  const int kCols = pair ? 8 : kRows;            // columns of y per warp
  const int64_t NO = pair ? N / 2 : N;           // columns of y
  // y's elements, f32 or bf16 (known at compile time unless kRt).
  const auto y_at = [&](int64_t i) -> float {
    if constexpr (kRt) return args.y_f32 ? static_cast<const float*>(args.y)[i]
                                         : __bfloat162float(static_cast<const __nv_bfloat16*>(args.y)[i]);
    else return to_f32(y[i]);
  };
  const auto y_store = [&](int64_t i, float v) {
    if constexpr (kRt) {
      if (args.y_f32) static_cast<float*>(args.y)[i] = v;
      else static_cast<__nv_bfloat16*>(args.y)[i] = __float2bfloat16_rn(v);
    } else {
      y[i] = from_f32<Out>(v);
    }
  };
  auto part = reinterpret_cast<float (*)[MT * 16][kRows]>(sbuf);  // [kWarps][MT · 16][kRows]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int G = kWarps / S;  // groups of rows of w per block; warp = slice · G + group
  const int group = warp % G, slice = warp / G;
  const int64_t block_n0 = int64_t(block) * G * kCols;
  const int64_t n0 = block_n0 + int64_t(group) * kCols;
  const int chunks = K / 32;
  const int c_begin = int(int64_t(slice) * chunks / S), c_end = int(int64_t(slice + 1) * chunks / S);

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

  // 16-byte units: chunk c of lane t is unit 4c + t of the row.
  const uint4* wrow[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    int64_t n = n0 + nt * 8 + g;
    if (pair) n = n0 + g < NO ? nt * NO + n0 + g : N - 1;
    wrow[nt] = reinterpret_cast<const uint4*>(w + (n < N ? n : int64_t(N) - 1) * ldw) + t;
  }
  // Loads past the end of the slice re-read its last chunk (always valid memory, no branch
  // to keep the compiler from hoisting them); the mma's for those steps are skipped.
  const int c_last = c_end - 1;
  uint4 cur[U][NT], next[U][NT];
  auto load = [&](uint4 (&dst)[U][NT], int c) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cu = c + u < c_last ? c + u : c_last;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) dst[u][nt] = ld_stream_16(wrow[nt] + 4 * cu);
    }
  };
  // An uploaded weight is never written by a kernel, so its first batch may be in flight
  // while the kernel before this one finishes (launch.cuh); anything else waits first.
  const bool active = n0 < NO && c_begin < c_end;  // warp-uniform
  if (w_uploaded && active) load(cur, c_begin);
  wait();
  if (!w_uploaded && active) load(cur, c_begin);

  // The residual products (o_proj, down: emitting the next norm): the residual this thread's
  // first output adds to and the norm weight it emits with are loaded now, so that their trip
  // to L2 runs under the main loop instead of after it, at the tail of every block. The same
  // values, so the same bits.
  const int block_cols = G * kCols;
  const bool has_early = emit && early_y && int(threadIdx.x) < M * block_cols &&
                         block_n0 + threadIdx.x % block_cols < NO;
  float y_early = 0.f, nw_early = 0.f;
  if (has_early) {
    const int64_t n = block_n0 + threadIdx.x % block_cols;
    if (accumulate) y_early = y_at(int64_t(threadIdx.x / block_cols) * ldy + n);
    nw_early = norm.norm_w[n];
  }

  // Each row's 1/rms from the emitting product's partial sums (written by the kernel before
  // this one, so after the wait; here, while the first weight batch is in flight: after the
  // main loop it made a DFlash step 0.15-0.17 ms slower, H200 2026-11-30): the two
  // half-warps of warp w take rows 2w and 2w + 1 (+ 16, …); lane l of a half adds partials
  // l, l + 16, … in order, then a fixed butterfly over the half. The same numbers for every M.
  float* inv_rms = sbuf + kWarps * MT * 16 * kRows;  // [MT · 16]
  if (scale_inv) {
    const int half = lane / 16, l16 = lane % 16;
    for (int m = 2 * warp + half; m - half < M; m += 2 * kWarps) {  // both halves run the shuffles
      float ss = 0.f;
      if (m < M) {
        const float* p = norm.partial_in + int64_t(m) * norm.ld_partial;
#pragma unroll 16
        for (int b = l16; b < norm.parts; b += 16) ss += p[b];
      }
#pragma unroll
      for (int o = 8; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (l16 == 0 && m < M) inv_rms[m] = rsqrtf(ss / static_cast<float>(K) + norm.eps);
    }
  }

  if (active) {  // an idle warp still takes part in the barrier below
    const uint4* xrow[MT][2];
    bool xin[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = mt * 16 + h * 8 + g;
        xin[mt][h] = m < M;
        xrow[mt][h] = reinterpret_cast<const uint4*>(x + int64_t(m < M ? m : 0) * ldx) + t;
      }

    for (int c = c_begin; c < c_end; c += U) {
      if (c + U < c_end) load(next, c + U);
      // x for XU steps at a time, loaded together so their latencies overlap (one step at a
      // time with two m16 tiles, where the registers would not hold more without spilling).
      constexpr int XU = MT == 1 ? (U < XU_MAX ? U : XU_MAX) : 1;
#pragma unroll
      for (int u0 = 0; u0 < U; u0 += XU) {
        uint4 a[XU][MT][2];
#pragma unroll
        for (int u = 0; u < XU; ++u) {
          const int cu = c + u0 + u < c_last ? c + u0 + u : c_last;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) a[u][mt][h] = xin[mt][h] ? load_x<X_NC>(xrow[mt][h] + 4 * cu) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < XU; ++u) {
          if (c + u0 + u >= c_end) break;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              const uint4 b = cur[u0 + u][nt];
              const uint4 lo = a[u][mt][0], hi = a[u][mt][1];  // rows g and g+8
              mma_bf16_16x8x16(acc[mt][nt], lo.x, hi.x, lo.y, hi.y, b.x, b.y);
              mma_bf16_16x8x16(acc[mt][nt], lo.z, hi.z, lo.w, hi.w, b.z, b.w);
            }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) cur[u][nt] = next[u][nt];
    }
  }

  // Accumulator fragment: rows g and g+8 of the m16 tile, columns 2t and 2t+1 of the n8 tile.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) part[warp][mt * 16 + g + (i / 2) * 8][nt * 8 + 2 * t + i % 2] = acc[mt][nt][i];
  __syncthreads();

  // Consecutive threads take consecutive columns of one row of y: coalesced stores.
  constexpr int kMaxBlockCols = kWarps * kRows;  // an emitting product's columns (never a pair)
  auto sq = reinterpret_cast<float (*)[kMaxBlockCols]>(inv_rms + MT * 16);  // emitting: [MT · 16][kMaxBlockCols]
  for (int i = threadIdx.x; i < M * block_cols; i += blockDim.x) {
    const int m = i / block_cols, col = i % block_cols;
    const int64_t n = block_n0 + col;
    if (n >= NO) {
      if (emit) sq[m][col] = 0.f;
      continue;
    }
    const int grp = col / kCols, r = col % kCols;
    float sum = part[grp][m][r];
    for (int s = 1; s < S; ++s) sum += part[s * G + grp][m][r];
    if (scale_inv) sum *= inv_rms[m];
    const int64_t dst = int64_t(m) * ldy + n;
    if (pair) {
      float up = part[grp][m][8 + r];
      for (int s = 1; s < S; ++s) up += part[s * G + grp][m][8 + r];
      if (scale_inv) up *= inv_rms[m];
      y_store(dst, silu_mul_f32(__bfloat162float(__float2bfloat16_rn(sum)), __bfloat162float(__float2bfloat16_rn(up))));
    } else {
      const bool early = emit && has_early && i == int(threadIdx.x);
      const float v = accumulate ? (early ? y_early : y_at(dst)) + sum : sum;
      y_store(dst, v);
      if (emit) {
        norm.h[int64_t(m) * norm.ldh + n] = __float2bfloat16_rn((early ? nw_early : norm.norm_w[n]) * v);
        sq[m][col] = v * v;
      }
    }
  }
  // Σ y² of each row over the block's columns, in column order (warp per row, lanes over
  // columns, the fixed butterfly): one partial per (row, block), whatever M is.
  if (emit) {
    __syncthreads();
    for (int m = warp; m < M; m += kWarps) {
      float ss = 0.f;
      for (int col = lane; col < block_cols; col += 32) ss += sq[m][col];
      ss = warp_sum(ss);
      if (lane == 0) norm.partial_out[int64_t(m) * norm.ld_partial + block] = ss;
    }
  }
}

// One tensor-core product as skinny_matmul / skinny_matmul_silu_mul would launch it (its
// arguments, n8 tiles per warp, block count); ok is false where that kernel does not take it.
struct MmaPlan {
  bool ok = false;
  SkinnyMmaArgs args{};
  int NT = 1;
  int blocks = 0;
};
MmaPlan plan_mma(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy, int M, int N, int K,
                 bool accumulate, bool w_uploaded, const SkinnyNorm* norm, bool pair);

}  // namespace dflash::cuda::skinny
