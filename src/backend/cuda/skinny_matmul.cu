// y (+)= x · wᵀ for the few rows of a decode or verification step (M ≤ 32), where the cost is
// streaming w once from memory.
//
// Main path (sm_80+, K a multiple of 32, 16-byte aligned rows): tensor cores, mma.sync
// m16n8k16 bf16 → f32, with x's rows padded with zeros to 16 (or 32) so that one row and a
// 16-row verification block run the very same instructions. Fallbacks (no tensor cores in the
// build, odd K, unaligned views): the CUDA-core kernels further down.
//
// Batch invariance: the value of output (m, n) must not depend on M or on the other rows of x
// (a row decoded alone must equal the same row inside a verification block, bit for bit; that
// is what makes greedy speculative output equal plain output). Every choice of kernel, tiling
// and K split below is made from N, K, the pointers and the strides, never from M; within a
// kernel, each output sees the same products in the same order for every M. cuBLAS gives no
// such promise (it picks kernels, split-K and tile orders by shape), which is why verification
// rows must not go through it while plain decoding rows go through this file.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/greedy_order.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/swiglu.cuh"

namespace dflash::cuda {
namespace {

// Two 8-warp blocks an SM. 16-warp blocks at 2-16 rows, each computing two 8-warp blocks'
// tiles (the same sums, so that twice the rows of w share a block's reads of x), made a step
// 1.2 % longer on an H200, all of it at o and down (level at q/k/v, +0.4 % at gate/up and the LM
// head). The likely reason (not measured apart): at 128 registers such a block needs a whole
// SM's register file, so it cannot become resident beside the tail of the kernel before it
// (docs/benchmarks.md, forty-first pass).
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
// accumulates its chunks in ascending order (from another start with DFLASH_SKINNY_ROTATE,
// rotation_chunks), mma 0 before mma 1, whatever M is. Rows of x at or
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

// What the epilogue does besides storing y (the deferred RMSNorm, SkinnyNorm in kernels.h).
enum Epilogue : int {
  kEpiPlain = 0,
  kEpiEmitNorm = 1,  // y is the f32 residual: also h = bf16(norm_w ⊙ y) and Σ y² per row over the block's columns
  kEpiScaleInv = 2,  // each output times its row's 1/rms, from the partial sums an emitting product wrote
};

// Each row's 1/rms from the emitting product's partial sums, for both tensor-core kernels: the
// two half-warps of warp w take rows 2w and 2w + 1 (+ 16, …); lane l of a half adds partials
// l, l + 16, … in order, then a fixed butterfly over the half. The same numbers for every M.
template <int MT>
__device__ __forceinline__ void rows_inv_rms(float (&inv_rms)[MT * 16], const SkinnyNorm& norm, int M, int K,
                                             int warp, int lane) {
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

// TILED: w is the weight pre-tiled for these kernels (skinny_tile_weight): for n8 tile τ (rows
// 8τ … 8τ + 7) and chunk c, the 512 bytes the warp's lanes load lie together, lane (g, t)'s 16
// at piece 4g + t, the chunks of a tile one after another. Every lane gets the values a
// row-major load gives it, so the mma's and the bits are the same; a warp's load is one
// contiguous 512-byte segment instead of 8 rows' 64 bytes (docs/benchmarks.md, twenty-sixth pass:
// 4294.6 against 3963.2 GB/s streamed). Tiles past the weight's last re-read its last one.
__device__ __forceinline__ const uint4* tiled_rows(const __nv_bfloat16* w, int64_t row0, int64_t N, int K, int lane) {
  const int64_t tiles = (N + 7) / 8, tau = row0 / 8 < tiles ? row0 / 8 : tiles - 1;
  return reinterpret_cast<const uint4*>(w) + tau * (K / 32) * 32 + lane;
}

// Where a warp's NT n8 tiles of w start, for chunk 0: rows first + 8·nt (PAIR: gate rows first …
// and up rows NO + first …). Row-major, lane (g, t) reads 16-byte unit t of its row g, and
// chunk c is 4c units on; rows past the weight re-read its last. TILED: tiled_rows.
template <int NT, bool PAIR, bool TILED>
__device__ __forceinline__ void point_weight_rows(const uint4* (&wrow)[NT], const __nv_bfloat16* w, int64_t ldw,
                                                  int64_t first, int N, int64_t NO, int K, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    if constexpr (TILED) {
      wrow[nt] = tiled_rows(w, PAIR ? (first < NO ? nt * NO + first : int64_t(N)) : first + nt * 8, N, K, lane);
    } else {
      int64_t n = first + nt * 8 + g;
      if constexpr (PAIR) n = first + g < NO ? nt * NO + first + g : N - 1;
      wrow[nt] = reinterpret_cast<const uint4*>(w + (n < N ? n : int64_t(N) - 1) * ldw) + t;
    }
  }
}

// Where a warp's walk of its K slice starts (DFLASH_SKINNY_ROTATE="mult:group", measuring
// only): batch (tile / group · mult) mod batches, then on round the slice. It comes from the tile
// alone, so a row alone and the same row in a block still see the same chunks in the same order;
// 0 (off, and always where the slice is not whole batches) is the plain ascending walk.
__device__ __forceinline__ int rotation_chunks(int64_t tile, int2 rotate, int n, int U) {
  if (rotate.x == 0 || n <= 0 || n % U != 0) return 0;
  return int((tile / rotate.y * rotate.x) % (n / U)) * U;
}

// Where the walk of a K slice [c_begin, c_end) goes after the batch of U chunks at c: on, or
// round to the slice's start (rotate).
__device__ __forceinline__ int next_position(int c, int U, int c_begin, int c_end) {
  return c + U < c_end ? c + U : c_begin;
}

// The top of each step of the walk (at c, `left` chunks still to come): the next batch goes out
// into `next` while this one is used, unless this is the last one or it went out early.
template <int PRE, int U, typename LoadNext>
__device__ __forceinline__ void load_next_batch(const LoadNext& load_next, bool& next_early, int c, int left,
                                                int c_begin, int c_end) {
  if (left > U && !(PRE == 2 && next_early)) load_next(next_position(c, U, c_begin, c_end));
  next_early = false;
}

// PAIR (NT == 2): w is [gate; up], 2·NO rows; a warp's two n8 tiles are gate rows n0 … n0+7
// and up rows NO + n0 … NO + n0 + 7, and the epilogue stores y[m, n] = silu(gate)·up for its
// 8 columns, each product first rounded to bf16 as the unfused gate_up tensor would hold it.
// Every product sums its K slices exactly as the plain kernel does (same chunks, same order,
// S from the same weight shape), so this equals matmul + silu_mul bit for bit.
template <int MT, int NT, typename Out, int EPI = kEpiPlain, bool PAIR = false, bool TILED = false, int PRE = 1>
__global__ void __launch_bounds__(kWarps * 32, 2)
    skinny_mma_kernel(const __nv_bfloat16* __restrict__ x, int64_t ldx, const __nv_bfloat16* __restrict__ w,
                      int64_t ldw, Out* __restrict__ y, int64_t ldy, int M, int N, int K, int S, bool accumulate,
                      const SkinnyNorm norm, bool w_uploaded, bool early_y, int2 rotate) {
  static_assert(EPI != kEpiEmitNorm || (!PAIR && std::is_same_v<Out, float>), "the residual stream is f32");
  constexpr int U = 8 / NT;  // chunks per batch: eight 16-byte weight loads per lane
  static_assert(!PAIR || NT == 2, "a gate/up pair is two n8 tiles");
  constexpr int kRows = NT * 8;                // rows of w per warp
  constexpr int kCols = PAIR ? 8 : kRows;      // columns of y per warp
  const int64_t NO = PAIR ? N / 2 : N;         // columns of y
  __shared__ float part[kWarps][MT * 16][kRows];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int G = kWarps / S;  // groups of rows of w per block; warp = slice · G + group
  const int group = warp % G, slice = warp / G;
  const int64_t block_n0 = int64_t(blockIdx.x) * G * kCols;
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

  const uint4* wrow[NT];
  point_weight_rows<NT, PAIR, TILED>(wrow, w, ldw, n0, N, NO, K, lane);
  // Loads past the end of the slice re-read its last chunk (always valid memory, no branch
  // to keep the compiler from hoisting them); the mma's for those steps are skipped.
  const int c_last = c_end - 1;
  const int rot = rotation_chunks(blockIdx.x, rotate, c_end - c_begin, U);
  // The chunk where logical chunk c of the walk lies (rotate).
  auto phys = [&](int c) { const int p = c + rot; return p >= c_end ? p - (c_end - c_begin) : p; };
  uint4 cur[U][NT], next[U][NT];
  auto load = [&](uint4 (&dst)[U][NT], int c) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cu = c + u < c_last ? c + u : c_last;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) dst[u][nt] = ld_stream_16(wrow[nt] + (TILED ? 32 : 4) * cu);
    }
  };
  // An uploaded weight is never written by a kernel, so its first PRE batches (prewait_batches)
  // may be in flight while the kernel before this one finishes (launch.cuh); anything else
  // waits first.
  const bool active = n0 < NO && c_begin < c_end;  // warp-uniform
  if (w_uploaded && active) load(cur, phys(c_begin));
  const auto load_next = [&](int c) { load(next, c); };
  [[maybe_unused]] bool next_early = false;  // PRE = 2: the second batch went out before the wait
  if constexpr (PRE == 2) {
    next_early = w_uploaded && active && c_end - c_begin > U;
    if (next_early) load_next(next_position(phys(c_begin), U, c_begin, c_end));
  }
  const TimelineMark mark = grid_dependency_begin();
  mark.shape(N, K, M);
  if (!w_uploaded && active) load(cur, phys(c_begin));

  // The residual products (o_proj, down: emitting the next norm): the residual this thread's
  // first output adds to and the norm weight it emits with are loaded now, so that their trip
  // to L2 runs under the main loop instead of after it, at the tail of every block. The same
  // values, so the same bits.
  const int block_cols = G * kCols;
  const bool has_early = EPI == kEpiEmitNorm && early_y && int(threadIdx.x) < M * block_cols &&
                         block_n0 + threadIdx.x % block_cols < NO;
  float y_early = 0.f, nw_early = 0.f;
  if (has_early) {
    const int64_t n = block_n0 + threadIdx.x % block_cols;
    if (accumulate) y_early = to_f32(y[int64_t(threadIdx.x / block_cols) * ldy + n]);
    nw_early = norm.norm_w[n];
  }

  // Each row's 1/rms (the partial sums are the kernel before's, so after the wait; here, while
  // the first weight batch is in flight: after the main loop it made a DFlash step 0.15-0.17 ms
  // slower, H200 2026-11-30).
  __shared__ float inv_rms[MT * 16];
  if constexpr (EPI == kEpiScaleInv) rows_inv_rms<MT>(inv_rms, norm, M, K, warp, lane);

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

    // c is where the walk is (rotate: from phys(c_begin) on round the slice), `left` how much
    // of it is still to come.
    for (int c = phys(c_begin), left = c_end - c_begin; left > 0; left -= U, c = next_position(c, U, c_begin, c_end)) {
      load_next_batch<PRE, U>(load_next, next_early, c, left, c_begin, c_end);
      // x for XU steps at a time, loaded together so their latencies overlap (one step at a
      // time with two m16 tiles, where the registers would not hold more without spilling).
      constexpr int XU = MT == 1 ? (U < 4 ? U : 4) : 1;
#pragma unroll
      for (int u0 = 0; u0 < U; u0 += XU) {
        uint4 a[XU][MT][2];
#pragma unroll
        for (int u = 0; u < XU; ++u) {
          const int cu = c + u0 + u < c_last ? c + u0 + u : c_last;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) a[u][mt][h] = xin[mt][h] ? __ldg(xrow[mt][h] + 4 * cu) : make_uint4(0, 0, 0, 0);
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
  constexpr int kMaxBlockCols = kWarps * kCols;
  __shared__ float sq[EPI == kEpiEmitNorm ? MT * 16 : 1][EPI == kEpiEmitNorm ? kMaxBlockCols : 1];
  for (int i = threadIdx.x; i < M * block_cols; i += blockDim.x) {
    const int m = i / block_cols, col = i % block_cols;
    const int64_t n = block_n0 + col;
    if (n >= NO) {
      if constexpr (EPI == kEpiEmitNorm) sq[m][col] = 0.f;
      continue;
    }
    const int grp = col / kCols, r = col % kCols;
    float sum = part[grp][m][r];
    for (int s = 1; s < S; ++s) sum += part[s * G + grp][m][r];
    if constexpr (EPI == kEpiScaleInv) sum *= inv_rms[m];
    Out* dst = y + int64_t(m) * ldy + n;
    if constexpr (PAIR) {
      float up = part[grp][m][8 + r];
      for (int s = 1; s < S; ++s) up += part[s * G + grp][m][8 + r];
      if constexpr (EPI == kEpiScaleInv) up *= inv_rms[m];
      *dst = from_f32<Out>(silu_mul_f32(__bfloat162float(__float2bfloat16_rn(sum)),
                                        __bfloat162float(__float2bfloat16_rn(up))));
    } else {
      const bool early = has_early && i == int(threadIdx.x);
      const float v = accumulate ? (early ? y_early : to_f32(*dst)) + sum : sum;
      *dst = from_f32<Out>(v);
      if constexpr (EPI == kEpiEmitNorm) {
        norm.h[int64_t(m) * norm.ldh + n] = __float2bfloat16_rn((early ? nw_early : norm.norm_w[n]) * v);
        if (norm.y_copy) norm.y_copy[int64_t(m) * norm.ld_y_copy + n] = __float2bfloat16_rn(v);
        sq[m][col] = v * v;
      }
    }
  }
  // Σ y² of each row over the block's columns, in column order (warp per row, lanes over
  // columns, the fixed butterfly): one partial per (row, block), whatever M is.
  if constexpr (EPI == kEpiEmitNorm) {
    __syncthreads();
    for (int m = warp; m < M; m += kWarps) {
      float ss = 0.f;
      for (int col = lane; col < block_cols; col += 32) ss += sq[m][col];
      ss = warp_sum(ss);
      if (lane == 0) norm.partial_out[int64_t(m) * norm.ld_partial + blockIdx.x] = ss;
    }
  }
  mark.exit();
}

// The greedy choice fused into a persistent product (skinny_matmul_argmax, ARGMAX): each
// thread keeps the best (value, column) of the outputs it stores, slot i of the epilogue's
// loop; at the end each block writes its best per row, and the last block to finish (a ticket
// counter, set back to zero by that block) reduces them into ids, in argmax_rows' order
// (greedy_order.cuh), so the choice is the two-launch path's.
constexpr int kArgSlots = 4 * kWarps * 32;  // epilogue slots a block may hold: M · block_cols (the LM head: 16 · 64)
struct RowArgmax {
  int32_t* ids = nullptr;  // [M] with stride ld_ids
  int64_t ld_ids = 1;
  float* part_v = nullptr;  // [M, gridDim.x]: each block's best
  int* part_i = nullptr;
  unsigned* ticket = nullptr;
  bool store_y = true;
};

// The end of an ARGMAX product: every thread's slots are final.
__device__ __forceinline__ void finish_row_argmax(const float* slot_v, const int* slot_i, int M, int block_cols,
                                                  const RowArgmax& a, int warp, int lane) {
  __syncthreads();
  for (int m = warp; m < M; m += kWarps) {
    float v = -INFINITY;
    int i = kNoColumn;
    for (int col = lane; col < block_cols; col += 32) keep_better(v, i, slot_v[m * block_cols + col], slot_i[m * block_cols + col]);
    warp_best(v, i);
    if (lane == 0) {
      a.part_v[int64_t(m) * gridDim.x + blockIdx.x] = v;
      a.part_i[int64_t(m) * gridDim.x + blockIdx.x] = i;
    }
  }
  __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(a.ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int m = warp; m < M; m += kWarps) {
    float v = -INFINITY;
    int i = kNoColumn;
    for (int b = lane; b < int(gridDim.x); b += 32)
      keep_better(v, i, __ldcg(a.part_v + int64_t(m) * gridDim.x + b), __ldcg(a.part_i + int64_t(m) * gridDim.x + b));
    warp_best(v, i);
    if (lane == 0) a.ids[int64_t(m) * a.ld_ids] = i == kNoColumn ? 0 : i;
  }
  if (threadIdx.x == 0) *a.ticket = 0;
}

template <int MT, int NT, typename Out, int EPI = kEpiPlain, bool PAIR = false, bool TILED = false, int PRE = 1,
          bool ARGMAX = false>
__global__ void __launch_bounds__(kWarps * 32, 2)
    skinny_mma_persistent_kernel(const __nv_bfloat16* __restrict__ x, int64_t ldx,
                                 const __nv_bfloat16* __restrict__ w, int64_t ldw, Out* __restrict__ y, int64_t ldy,
                                 int M, int N, int K, int S, bool accumulate, const SkinnyNorm norm, bool w_uploaded,
                                 bool early_y, int tiles, unsigned* sched, int2 rotate, bool cross_tile,
                                 const RowArgmax arg) {
  static_assert(EPI != kEpiEmitNorm || (!PAIR && std::is_same_v<Out, float>), "the residual stream is f32");
  static_assert(!ARGMAX || (!PAIR && EPI != kEpiEmitNorm && std::is_same_v<Out, float>), "argmax of f32 logits");
  constexpr int U = 8 / NT;  // chunks per batch: eight 16-byte weight loads per lane
  static_assert(!PAIR || NT == 2, "a gate/up pair is two n8 tiles");
  constexpr int kRows = NT * 8;                // rows of w per warp
  constexpr int kCols = PAIR ? 8 : kRows;      // columns of y per warp
  const int64_t NO = PAIR ? N / 2 : N;         // columns of y
  __shared__ float part[kWarps][MT * 16][kRows];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int G = kWarps / S;  // groups of rows of w per tile; warp = slice · G + group
  const int group = warp % G, slice = warp / G;
  const int chunks = K / 32;
  const int c_begin = int(int64_t(slice) * chunks / S), c_end = int(int64_t(slice + 1) * chunks / S);
  const int block_cols = G * kCols;

  // skinny_mma_kernel for more tiles than resident slots. A tile is what one block of
  // skinny_mma_kernel computes: G groups of rows of w, all K. The grid holds one block per
  // resident slot; block b starts with tile b and then takes the next tile from `sched` (a
  // counter of this stream's, see sched_counter) or, with none, tile b + gridDim.x, and so on.
  // The next tile's first weight batch is issued before the current tile's epilogue, so a
  // block's loads do not stop between tiles as they did between one block's exit and the next
  // block's first loads (the gate/up product, 768 tiles, ran in three waves of blocks). Which
  // block computes a tile changes nothing in how: the same mma's, chunks and sums, the same
  // bits as skinny_mma_kernel. (That kernel keeps its own body: one body for both, the loop
  // compiled away for one tile, had ptxas schedule the one-tile products differently, and plain
  // decode at Qwen3-8B shapes ran 2 % slower; H200, 2026-12-01, docs/benchmarks.md.)
  //
  // The counter: after the wait, one kernel at a time uses it (each waits for the one before).
  // Each block takes one number per tile it computes, the last one failing, so the numbers
  // taken are exactly `tiles`; whoever takes number tiles − 1 took the last and sets it back to
  // zero for the next kernel.
  __shared__ unsigned next_tile;
  // cross_tile (DFLASH_SKINNY_CROSS_TILE, on by default): the next tile's first batch goes out in
  // the last step of this tile's walk, before its last batch is used, so that a warp's loads do
  // not stop at the barrier that ends the walk (where every block of the product stopped at
  // about the same moment). The number comes from thread 0's counter read through `upcoming`,
  // tagged with the tile it was taken in, so that a value left from the block's tile before is
  // never taken for this one. The block computes the same tiles either way, and the sums are
  // the same.
  __shared__ volatile unsigned long long upcoming;
  // Up to 16 rows only: with two m16 tiles the walk's registers do not hold it without spilling.
  const bool cross = MT == 1 && cross_tile && rotate.x == 0;
  if (cross) {  // no tile is numbered 2^32 − 1
    if (threadIdx.x == 0) upcoming = ~0ull;
    __syncthreads();
  }
  int tile = blockIdx.x;
  int64_t block_n0 = int64_t(tile) * block_cols;
  int64_t n0 = block_n0 + int64_t(group) * kCols;

  const uint4* wrow[NT];
  auto point_rows = [&](int64_t first) { point_weight_rows<NT, PAIR, TILED>(wrow, w, ldw, first, N, NO, K, lane); };
  point_rows(n0);
  // Loads past the end of the slice re-read its last chunk (always valid memory, no branch
  // to keep the compiler from hoisting them); the mma's for those steps are skipped.
  const int c_last = c_end - 1;
  int rot = rotation_chunks(tile, rotate, c_end - c_begin, U);
  // The chunk where logical chunk c of the walk lies (rotate).
  auto phys = [&](int c) { const int p = c + rot; return p >= c_end ? p - (c_end - c_begin) : p; };
  uint4 cur[U][NT], next[U][NT];
  auto load = [&](uint4 (&dst)[U][NT], int c) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cu = c + u < c_last ? c + u : c_last;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) dst[u][nt] = ld_stream_16(wrow[nt] + (TILED ? 32 : 4) * cu);
    }
  };
  // An uploaded weight is never written by a kernel, so its first tile's first PRE batches
  // (prewait_batches) may be in flight while the kernel before this one finishes (launch.cuh);
  // anything else waits first.
  bool active = n0 < NO && c_begin < c_end;  // warp-uniform
  if (w_uploaded && active) load(cur, phys(c_begin));
  const auto load_next = [&](int c) { load(next, c); };
  [[maybe_unused]] bool next_early = false;  // PRE = 2: the second batch went out before the wait
  if constexpr (PRE == 2) {
    next_early = w_uploaded && active && c_end - c_begin > U;
    if (next_early) load_next(next_position(phys(c_begin), U, c_begin, c_end));
  }
  const TimelineMark mark = grid_dependency_begin();
  mark.shape(N, K, M);
  if (!w_uploaded && active) load(cur, phys(c_begin));

  // The residual products (o_proj, down: emitting the next norm): the residual this thread's
  // first output adds to and the norm weight it emits with are loaded now, so that their trip
  // to L2 runs under the main loop instead of after it, at the tail of every tile. The same
  // values, so the same bits.
  bool has_early = false;
  float y_early = 0.f, nw_early = 0.f;
  auto load_early = [&] {
    has_early = EPI == kEpiEmitNorm && early_y && int(threadIdx.x) < M * block_cols &&
                block_n0 + threadIdx.x % block_cols < NO;
    if (has_early) {
      const int64_t n = block_n0 + threadIdx.x % block_cols;
      if (accumulate) y_early = to_f32(y[int64_t(threadIdx.x / block_cols) * ldy + n]);
      nw_early = norm.norm_w[n];
    }
  };
  load_early();

  // Each row's 1/rms (the partial sums are the kernel before's, so after the wait; here, while
  // the first weight batch is in flight: after the main loop it made a DFlash step 0.15-0.17 ms
  // slower, H200 2026-11-30).
  __shared__ float inv_rms[MT * 16];
  if constexpr (EPI == kEpiScaleInv) rows_inv_rms<MT>(inv_rms, norm, M, K, warp, lane);

  constexpr int kMaxBlockCols = kWarps * kCols;
  __shared__ float sq[EPI == kEpiEmitNorm ? MT * 16 : 1][EPI == kEpiEmitNorm ? kMaxBlockCols : 1];
  // ARGMAX: epilogue slot i's best so far (the host keeps M · block_cols within kArgSlots).
  __shared__ float slot_v[ARGMAX ? kArgSlots : 1];
  __shared__ int slot_i[ARGMAX ? kArgSlots : 1];
  if constexpr (ARGMAX)
    for (int i = threadIdx.x; i < kArgSlots; i += blockDim.x) slot_v[i] = -INFINITY, slot_i[i] = kNoColumn;
  for (;;) {
    unsigned taken = 0;
    if (sched && threadIdx.x == 0) taken = atomicAdd(sched, 1u);  // used one step into the walk
    const bool publishes = cross && sched && threadIdx.x == 0;
    // What thread 0 publishes: the next tile's number, tagged with this tile's.
    const auto tagged_next = [&] {
      return (static_cast<unsigned long long>(unsigned(tile)) << 32) | (taken + gridDim.x);
    };
    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

    if (active) {  // an idle warp still takes part in the barriers below
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

      // c is where the walk is (rotate: from phys(c_begin) on round the slice), `left` how much
      // of it is still to come.
      for (int c = phys(c_begin), left = c_end - c_begin; left > 0; left -= U, c = next_position(c, U, c_begin, c_end)) {
        load_next_batch<PRE, U>(load_next, next_early, c, left, c_begin, c_end);
        // Thread 0 publishes the next tile's number from the second step on (by then the counter
        // has answered: the first step's weights took as long), or in the only one.
        if (publishes && (c != c_begin || left <= U)) upcoming = tagged_next();  // (no rotation where it publishes)
        if (cross && left <= U) {  // the last step: the next tile's first batch goes out now
          unsigned following = unsigned(tile) + gridDim.x;
          if (sched) {
            unsigned long long v;
            do v = upcoming; while (unsigned(v >> 32) != unsigned(tile));
            following = unsigned(v);
          }
          const int64_t following_n0 = int64_t(following) * block_cols + int64_t(group) * kCols;
          if (following < unsigned(tiles) && following_n0 < NO) {
            point_rows(following_n0);
            load(next, c_begin);
          }
        }
        // x for XU steps at a time, loaded together so their latencies overlap (one step at a
        // time with two m16 tiles, where the registers would not hold more without spilling).
        constexpr int XU = MT == 1 ? (U < 4 ? U : 4) : 1;
#pragma unroll
        for (int u0 = 0; u0 < U; u0 += XU) {
          uint4 a[XU][MT][2];
#pragma unroll
          for (int u = 0; u < XU; ++u) {
            const int cu = c + u0 + u < c_last ? c + u0 + u : c_last;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
              for (int h = 0; h < 2; ++h)
                a[u][mt][h] = xin[mt][h] ? __ldg(xrow[mt][h] + 4 * cu) : make_uint4(0, 0, 0, 0);
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
    // A walk of no steps published nothing (thread 0's warp always walks; no warp waits on this).
    if (publishes && !active) upcoming = tagged_next();
    if (sched && threadIdx.x == 0) {
      next_tile = taken + gridDim.x;
      if (taken == unsigned(tiles) - 1) *sched = 0;
    }
    __syncthreads();

    // The next tile's first batch goes out now, before this tile's epilogue.
    const int this_tile = tile;
    const int64_t this_n0 = block_n0;
    tile = sched ? int(next_tile) : tile + int(gridDim.x);
    const bool more = tile < tiles;  // block-uniform
    if (more) {
      // A warp that walked the tile before has this tile's first batch in `cur` already (cross).
      const bool loaded = cross && active;
      block_n0 = int64_t(tile) * block_cols;
      n0 = block_n0 + int64_t(group) * kCols;
      active = n0 < NO && c_begin < c_end;
      point_rows(n0);
      rot = rotation_chunks(tile, rotate, c_end - c_begin, U);
      if (active && !loaded) load(cur, phys(c_begin));
    }

    // Consecutive threads take consecutive columns of one row of y: coalesced stores.
    for (int i = threadIdx.x; i < M * block_cols; i += blockDim.x) {
      const int m = i / block_cols, col = i % block_cols;
      const int64_t n = this_n0 + col;
      if (n >= NO) {
        if constexpr (EPI == kEpiEmitNorm) sq[m][col] = 0.f;
        continue;
      }
      const int grp = col / kCols, r = col % kCols;
      float sum = part[grp][m][r];
      for (int s = 1; s < S; ++s) sum += part[s * G + grp][m][r];
      if constexpr (EPI == kEpiScaleInv) sum *= inv_rms[m];
      Out* dst = y + int64_t(m) * ldy + n;
      if constexpr (PAIR) {
        float up = part[grp][m][8 + r];
        for (int s = 1; s < S; ++s) up += part[s * G + grp][m][8 + r];
        if constexpr (EPI == kEpiScaleInv) up *= inv_rms[m];
        *dst = from_f32<Out>(silu_mul_f32(__bfloat162float(__float2bfloat16_rn(sum)),
                                          __bfloat162float(__float2bfloat16_rn(up))));
      } else if constexpr (ARGMAX) {
        const float v = accumulate ? to_f32(*dst) + sum : sum;
        if (arg.store_y) *dst = from_f32<Out>(v);
        keep_better(slot_v[i], slot_i[i], v, int(n));
      } else {
        const bool early = has_early && i == int(threadIdx.x);
        const float v = accumulate ? (early ? y_early : to_f32(*dst)) + sum : sum;
        *dst = from_f32<Out>(v);
        if constexpr (EPI == kEpiEmitNorm) {
          norm.h[int64_t(m) * norm.ldh + n] = __float2bfloat16_rn((early ? nw_early : norm.norm_w[n]) * v);
          if (norm.y_copy) norm.y_copy[int64_t(m) * norm.ld_y_copy + n] = __float2bfloat16_rn(v);
          sq[m][col] = v * v;
        }
      }
    }
    // Σ y² of each row over the tile's columns, in column order (warp per row, lanes over
    // columns, the fixed butterfly): one partial per (row, tile), whatever M is.
    if constexpr (EPI == kEpiEmitNorm) {
      __syncthreads();
      for (int m = warp; m < M; m += kWarps) {
        float ss = 0.f;
        for (int col = lane; col < block_cols; col += 32) ss += sq[m][col];
        ss = warp_sum(ss);
        if (lane == 0) norm.partial_out[int64_t(m) * norm.ld_partial + this_tile] = ss;
      }
    }
    if (!more) break;
    load_early();
    __syncthreads();  // part and sq are written again by the next tile
  }
  if constexpr (ARGMAX) finish_row_argmax(slot_v, slot_i, M, block_cols, arg, warp, lane);
  mark.exit();
}

// Process-wide settings, read once (so they can never split a row alone from the same row in a
// block). Tensor cores are used when the kernel exists in this binary for this device: a build
// whose only PTX predates sm_80 (CMake's default CUDA architecture on some toolkits) has it
// compiled to a trap. Environment variables for measuring on the GPU without a rebuild:
// DFLASH_SKINNY_MMA=0 forces the CUDA-core kernels (to compare against them),
// DFLASH_SKINNY_TARGET_WARPS=n replaces the wave rule by a K-split target of n warps,
// DFLASH_SKINNY_PREWAIT=0 loads an uploaded weight's first batch after the grid dependency wait
// too, =1 issues one batch before it everywhere (as before the thirty-third pass), =2 two
// (prewait_batches), DFLASH_SKINNY_EARLY_Y=0 loads the emitting products' residual at the end of the
// block, as before the tenth pass, and DFLASH_SKINNY_PERSIST=0 launches a block a tile even
// where there are more tiles than slots (as before the eighteenth pass), =1 has the
// persistent kernel's blocks take their tiles in a fixed stride instead of from the counter;
// DFLASH_SKINNY_SLICES="N:K=S,…" sets the K slices of a weight shape, DFLASH_SKINNY_ROTATE="mult:group"
// starts each tile's walk of its K slice at a batch of its own (rotation_chunks; both measuring only),
// DFLASH_SKINNY_CROSS_TILE=0 has the persistent kernel issue a tile's first batch after the barrier
// that ends the tile before (not in that tile's last step) and DFLASH_SKINNY_PREWAIT_PERSISTENT=1
// gives the persistent products one batch before their wait (prewait_batches; both measuring).
struct MmaSettings {
  bool enabled = false;
  int64_t target_warps = kTargetWarps;
  int64_t block_slots = 0;  // blocks resident at once (SMs × 2); 0: use target_warps
  int sms = 0;
  // Weight batches issued before the grid dependency wait (prewait_batches): -1 the rule, else
  // DFLASH_SKINNY_PREWAIT=0, 1 or 2 for every uploaded weight (2: up to 16 rows), or with
  // DFLASH_SKINNY_PREWAIT=2 and DFLASH_SKINNY_PREWAIT2_SHAPES="N:K,…" two for those shapes and
  // the rule's choice for the rest.
  int prewait = -1;
  bool early_y = true;
  std::set<std::pair<int, int>> prewait2_shapes;
  int persist = 2;  // 0: a block a tile; 1: resident blocks, tiles in a fixed stride; 2: from the counter
  std::map<std::pair<int, int>, int> slices;  // DFLASH_SKINNY_SLICES: (N, K) -> S, measuring only
  int2 rotate{0, 1};  // DFLASH_SKINNY_ROTATE="mult[:group]" (rotation_chunks), measuring only
  bool cross_tile = true;  // DFLASH_SKINNY_CROSS_TILE=0: the next tile's first batch after the walk's barrier
  int prewait_persistent = 2;  // DFLASH_SKINNY_PREWAIT_PERSISTENT=1: the rule gives persistent products one
  // DFLASH_DIAG_SKINNY_LDX=n (measuring only, wrong output): products of more than one row read
  // x with row stride n elements. 0 puts every row on row 0 (x's L2 bytes and L1 lines those of
  // one row); 64 keeps a load's eight 128-byte lines but lays the rows over each other (x's L2
  // bytes about one row's). What x's traffic costs a verification.
  int64_t diag_ldx = -1;
  // DFLASH_DIAG_SKINNY_LDX_SHAPES="N:K,…": the stride above for those weight shapes only (none
  // listed: every shape).
  std::set<std::pair<int, int>> ldx_shapes;
};

// "N:K,…" (an environment list of weight shapes; a malformed item is ignored, none gives none).
std::set<std::pair<int, int>> weight_shapes(const char* e) {
  std::set<std::pair<int, int>> shapes;
  const std::string list = e ? e : "";
  for (size_t start = 0; start < list.size();) {
    const size_t end = std::min(list.find(',', start), list.size());
    int n = 0, k = 0;
    if (std::sscanf(list.substr(start, end - start).c_str(), "%d:%d", &n, &k) == 2) shapes.insert({n, k});
    start = end + 1;
  }
  return shapes;
}

const MmaSettings& mma_settings() {
  static const MmaSettings settings = [] {
    MmaSettings m;
    cudaFuncAttributes a{};
    if (cudaFuncGetAttributes(&a, skinny_mma_kernel<1, 1, float>) == cudaSuccess)
      m.enabled = a.ptxVersion >= 80 && a.binaryVersion >= 80;
    else
      (void)cudaGetLastError();  // not sticky: the fallback kernels still run
    if (const char* e = std::getenv("DFLASH_SKINNY_MMA"); e && std::string(e) == "0") m.enabled = false;
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess)
      m.block_slots = int64_t(sms) * 2, m.sms = sms;  // 8-warp blocks, two per SM (16 warps)
    else
      (void)cudaGetLastError();
    if (const char* e = std::getenv("DFLASH_SKINNY_TARGET_WARPS"); e && std::atoll(e) > 0) {
      m.target_warps = std::atoll(e);
      m.block_slots = 0;
    }
    if (const char* e = std::getenv("DFLASH_SKINNY_PREWAIT"); e && (std::string(e) == "0" || std::string(e) == "1" ||
                                                                    std::string(e) == "2"))
      m.prewait = std::atoi(e);
    m.prewait2_shapes = weight_shapes(std::getenv("DFLASH_SKINNY_PREWAIT2_SHAPES"));
    if (const char* e = std::getenv("DFLASH_SKINNY_EARLY_Y"); e && std::string(e) == "0") m.early_y = false;
    if (const char* e = std::getenv("DFLASH_SKINNY_PERSIST"); e && *e) m.persist = std::atoi(e);
    if (const char* e = std::getenv("DFLASH_SKINNY_CROSS_TILE"); e && std::string(e) == "0") m.cross_tile = false;
    if (const char* e = std::getenv("DFLASH_SKINNY_PREWAIT_PERSISTENT"); e && std::string(e) == "1") m.prewait_persistent = 1;
    if (const char* e = std::getenv("DFLASH_DIAG_SKINNY_LDX"); e && *e && std::atoll(e) >= 0) m.diag_ldx = std::atoll(e);
    m.ldx_shapes = weight_shapes(std::getenv("DFLASH_DIAG_SKINNY_LDX_SHAPES"));
    if (const char* e = std::getenv("DFLASH_SKINNY_ROTATE")) {
      int mult = 0, group = 1;
      if (std::sscanf(e, "%d:%d", &mult, &group) >= 1 && mult >= 0 && group >= 1) m.rotate = make_int2(mult, group);
    }
    // "N:K=S,…": the K slices of the weight of that shape (a power of two up to 8), instead of
    // the wave rule's; a malformed item is ignored.
    if (const char* e = std::getenv("DFLASH_SKINNY_SLICES")) {
      std::string list = e;
      for (size_t start = 0; start < list.size();) {
        const size_t end = std::min(list.find(',', start), list.size());
        int n = 0, k = 0, sl = 0;
        if (std::sscanf(list.substr(start, end - start).c_str(), "%d:%d=%d", &n, &k, &sl) == 3 &&
            (sl == 1 || sl == 2 || sl == 4 || sl == 8))
          m.slices[{n, k}] = sl;
        start = end + 1;
      }
    }
    return m;
  }();
  return settings;
}

// Blocks of the tensor-core kernel for a weight of N rows (N / 2 outputs when PAIR) at n8
// tiles per warp NT and S K slices: what an emitting product writes partial sums for.
int64_t mma_blocks(int64_t N, int NT, int S, bool pair) {
  const int64_t cols_per_warp = pair ? 8 : NT * 8;
  const int64_t groups = ((pair ? N / 2 : N) + cols_per_warp - 1) / cols_per_warp;
  const int G = kWarps / S;
  return (groups + G - 1) / G;
}

// The tile counters of skinny_mma_persistent_kernel: one per stream, since products on two
// streams may run at once, each set back to zero by the kernel that used it last. Zero at
// module load. Streams take them round-robin: past 64 streams two share one, which is wrong
// only if both run a persistent product at the same moment (the backend uses one stream).
constexpr int kSchedCounters = 64;
__device__ unsigned g_sched_counters[kSchedCounters];

// The fused argmax's ticket counters (RowArgmax), one per stream in the same way, each set back
// to zero by the block that took the last ticket.
__device__ unsigned g_argmax_tickets[kSchedCounters];

int stream_counter_slot(cudaStream_t s) {
  static std::mutex mutex;
  static std::map<cudaStream_t, int> slots;
  std::lock_guard<std::mutex> lock(mutex);
  return slots.try_emplace(s, static_cast<int>(slots.size() % kSchedCounters)).first->second;
}

unsigned* device_counters(const void* symbol) {
  void* p = nullptr;
  check(cudaGetSymbolAddress(&p, symbol), "matmul (skinny)", "cudaGetSymbolAddress");
  return static_cast<unsigned*>(p);
}

unsigned* sched_counter(cudaStream_t s) {
  static unsigned* base = device_counters(g_sched_counters);
  return base + stream_counter_slot(s);
}

unsigned* argmax_ticket(cudaStream_t s) {
  static unsigned* base = device_counters(g_argmax_tickets);
  return base + stream_counter_slot(s);
}

template <int MT, int NT, typename Out, int EPI, bool PAIR, bool TILED, bool ARGMAX = false>
int64_t persistent_slots() {
  // Blocks of the persistent kernel resident at once (two per SM by its launch bounds).
  static const int64_t slots = [] {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &per_sm, skinny_mma_persistent_kernel<MT, NT, Out, EPI, PAIR, TILED, 1, ARGMAX>, kWarps * 32, 0) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      per_sm = 0;
    }
    return int64_t(per_sm) * mma_settings().sms;
  }();
  return slots;
}

// The tensor-core products' shared-memory carveout up to 16 rows (one m16 tile): a quarter (64 KB
// of the unified 256; their two blocks an SM use 18-34 KB with the 1 KB each block reserves), as
// the decode split attention asks for (kDecodeSplitCarveout in attention.cu). Two m16 tiles'
// blocks (up to 33 KB each) would not fit two an SM in it: the driver's choice there. Against the
// driver's choice, alternating in one run (H200, 2026-12-02, docs/benchmarks.md twenty-eighth
// pass): a DFlash step 1.2 % shorter at 512 cached rows (5.893-5.896 against 5.961-5.976 ms) and
// 28 % at 4096 (7.51-7.56 against 10.39-10.45 ms, where the split attention runs at the driver's
// large carveout), plain decode level at 512 and 2.5 % faster at 4096. 44 % was slower. The same
// bits either way.
constexpr int kSkinnyCarveout = 25;

// How many batches of an uploaded weight a product of up to 16 rows issues before its wait
// (DFLASH_SKINNY_PREWAIT overrides it, MmaSettings). The rule: two where each warp walks at least
// 8 batches of its K slice, one otherwise. Measured (docs/benchmarks.md, thirty-third pass): two
// batches for q/k/v (8 batches a warp) and down (12) made plain decode 0.6-0.9 % faster on an
// H200 and an H100 at 512 and 4096 cached rows; a DFlash step was 1.5 % / 0.3 % shorter on the
// H200 at 512 / 4096 rows, level / 0.3-0.9 % longer on the H100. Two for every product then
// lost (plain decode -1.4 %), but that setting gave o two as well, whose early weights lengthen
// the split attention beside it (thirty-fourth pass). Two for the persistent products alone
// (gate/up, 8 batches a warp, and the LM head, 16; with the cross-tile walk) made plain decode
// 2.2 % faster and a step 1.6 % shorter on an H200 (thirty-fifth pass;
// DFLASH_SKINNY_PREWAIT_PERSISTENT=1 gives them one again, for measuring). o (4 batches a warp)
// keeps one. When a batch is loaded changes no sum, so the same bits either way.
int prewait_batches(const MmaSettings& ms, int N, int K, int S, int NT, bool persistent) {
  if (ms.prewait == 2 && !ms.prewait2_shapes.empty()) {
    if (ms.prewait2_shapes.count({N, K})) return 2;
  } else if (ms.prewait >= 0) {
    return ms.prewait;
  }
  const int U = 8 / NT;
  return (!persistent || ms.prewait_persistent == 2) && (K / 32) / S >= 8 * U ? 2 : 1;
}

// `slots` > 0: the persistent kernel with that many blocks (more tiles than resident slots).
template <int MT, int NT, typename Out, int EPI, bool PAIR, bool TILED, int PRE>
void launch_mma_kernels(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy, int M, int N,
                        int K, int S, bool accumulate, bool prewait, const SkinnyNorm& norm, int64_t tiles,
                        int64_t slots, cudaStream_t s) {
  const MmaSettings& ms = mma_settings();
  const auto* xp = static_cast<const __nv_bfloat16*>(x);
  const auto* wp = static_cast<const __nv_bfloat16*>(w);
  if (slots > 0) {
    unsigned* sched = ms.persist == 2 ? sched_counter(s) : nullptr;
    constexpr auto kernel = skinny_mma_persistent_kernel<MT, NT, Out, EPI, PAIR, TILED, PRE>;
    if constexpr (MT == 1) default_carveout<kernel>(kSkinnyCarveout, "matmul (skinny)");
    launch_kernel("matmul (skinny)", kernel, unsigned(slots), kWarps * 32, 0, s, xp, ldx, wp, ldw, static_cast<Out*>(y),
                  ldy, M, N, K, S, accumulate, norm, prewait, ms.early_y, static_cast<int>(tiles), sched, ms.rotate,
                  ms.cross_tile, RowArgmax{});
    return;
  }
  constexpr auto kernel = skinny_mma_kernel<MT, NT, Out, EPI, PAIR, TILED, PRE>;
  if constexpr (MT == 1) default_carveout<kernel>(kSkinnyCarveout, "matmul (skinny)");
  launch_kernel("matmul (skinny)", kernel, unsigned(tiles), kWarps * 32, 0, s, xp, ldx, wp, ldw, static_cast<Out*>(y), ldy,
                M, N, K, S, accumulate, norm, prewait, ms.early_y, ms.rotate);
}

template <int MT, int NT, typename Out, int EPI = kEpiPlain, bool PAIR = false, bool TILED = false>
void launch_mma(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy, int M, int N, int K,
                int S, bool accumulate, bool w_uploaded, const SkinnyNorm& norm, cudaStream_t s) {
  const MmaSettings& ms = mma_settings();
  if (ms.diag_ldx >= 0 && M > 1 && M <= 16 && ms.diag_ldx <= ldx &&
      (ms.ldx_shapes.empty() || ms.ldx_shapes.count({N, K})))
    ldx = ms.diag_ldx;
  const bool prewait = w_uploaded && ms.prewait != 0;
  const int64_t tiles = mma_blocks(N, NT, S, PAIR);
  int64_t slots = ms.persist > 0 ? persistent_slots<MT, NT, Out, EPI, PAIR, TILED>() : 0;
  if (tiles <= slots) slots = 0;  // a block a tile
  if constexpr (MT == 1) {
    if (prewait && prewait_batches(ms, N, K, S, NT, slots > 0) == 2) {
      launch_mma_kernels<MT, NT, Out, EPI, PAIR, TILED, 2>(x, ldx, w, ldw, y, ldy, M, N, K, S, accumulate, prewait, norm,
                                                           tiles, slots, s);
      return;
    }
  }
  launch_mma_kernels<MT, NT, Out, EPI, PAIR, TILED, 1>(x, ldx, w, ldw, y, ldy, M, N, K, S, accumulate, prewait, norm,
                                                       tiles, slots, s);
}

// The tensor-core kernel's tiling for a weight: n8 tiles per warp and K slices per block, from N
// and K only (shared by the plain and the fused products, so both reduce a weight the same way).
struct MmaTiling {
  int NT = 1, S = 1;
};
// `block_slots` > 0 (the default): K slices are chosen for whole waves instead of a warp
// target. Measured on the H200 (doctor, 2026-11-29), the gate/up product (N = 24576) ran 10 %
// slower with 2 slices (384 blocks: 1.45 waves of 264 block slots) than with 1 or 4 (0.73 and
// 2.9 waves), and the 4096-row products were fastest at 8 slices (0.97 waves).
MmaTiling mma_tiling_rule(int N, int K, int64_t target_warps, int64_t block_slots) {
  MmaTiling m;
  // Two n8 tiles per warp once there are rows enough to fill the GPU that way; then as many K
  // slices per block as it takes to reach the target warp count, while slices stay long.
  m.NT = (int64_t(N) + 15) / 16 * kWarps >= target_warps ? 2 : 1;
  const int64_t groups = (int64_t(N) + m.NT * 8 - 1) / (m.NT * 8);
  if (block_slots <= 0) {
    while (m.S < kWarps && groups * m.S < target_warps && K / 32 >= 2 * m.S * kMinSliceChunks) m.S *= 2;
    return m;
  }
  // The slice count whose blocks best fill their last wave (ties: fewer slices); a block is
  // kWarps warps of one slice.
  double best = -1;
  for (int S = 1; S <= kWarps && (S == 1 || K / 32 >= S * kMinSliceChunks); S *= 2) {
    const int64_t blocks = (groups * S + kWarps - 1) / kWarps;
    const int64_t waves = (blocks + block_slots - 1) / block_slots;
    const double fill = double(blocks) / double(waves * block_slots);
    if (fill > best + 1e-9) {
      best = fill;
      m.S = S;
    }
  }
  return m;
}

// The rule, or DFLASH_SKINNY_SLICES where it names the shape.
MmaTiling mma_tiling(int N, int K, int64_t target_warps, int64_t block_slots) {
  MmaTiling m = mma_tiling_rule(N, K, target_warps, block_slots);
  if (const auto it = mma_settings().slices.find({N, K});
      it != mma_settings().slices.end() && (it->second == 1 || K / 32 >= it->second * kMinSliceChunks))
    m.S = it->second;
  return m;
}

template <typename Out, int EPI>
void dispatch_mma(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy, int M, int N, int K,
                  const MmaTiling& tl, bool accumulate, bool w_uploaded, const SkinnyNorm& norm, cudaStream_t s,
                  const void* w_tiled = nullptr) {
  // One m16 tile for up to 16 rows, two beyond: a row's arithmetic is the same in either.
  const int S = tl.S;
  if (w_tiled && tl.NT == 2) {  // the pre-tiled copy (two n8 tiles a warp only: the large weights)
    if (M <= 16)
      launch_mma<1, 2, Out, EPI, false, true>(x, ldx, w_tiled, ldw, y, ldy, M, N, K, S, accumulate, w_uploaded, norm, s);
    else
      launch_mma<2, 2, Out, EPI, false, true>(x, ldx, w_tiled, ldw, y, ldy, M, N, K, S, accumulate, w_uploaded, norm, s);
    return;
  }
  if (M <= 16) {
    if (tl.NT == 2) launch_mma<1, 2, Out, EPI>(x, ldx, w, ldw, y, ldy, M, N, K, S, accumulate, w_uploaded, norm, s);
    else launch_mma<1, 1, Out, EPI>(x, ldx, w, ldw, y, ldy, M, N, K, S, accumulate, w_uploaded, norm, s);
  } else {
    if (tl.NT == 2) launch_mma<2, 2, Out, EPI>(x, ldx, w, ldw, y, ldy, M, N, K, S, accumulate, w_uploaded, norm, s);
    else launch_mma<2, 1, Out, EPI>(x, ldx, w, ldw, y, ldy, M, N, K, S, accumulate, w_uploaded, norm, s);
  }
}

// ---------------------------------------------------------------------------------------------
// CUDA-core fallbacks. One warp owns R rows of w; its lanes walk K in 16-byte chunks (8 bf16),
// keep M·R f32 partial sums, and reduce them with a fixed butterfly: the partial sum of output
// (m, n) sees the same chunks in the same order, and the same butterfly, for any M and any R.

constexpr int kUnroll = 4;  // chunks loaded before the first is used: loads in flight per lane

// The CUDA-core kernels' epilogue: each (row of x, row of w) partial is summed over the warp's
// lanes by the fixed butterfly and lane 0 stores it (adding to y when accumulating).
template <int MT, int R, typename Out>
__device__ __forceinline__ void store_lane_sums(const float (&acc)[R][MT], int M, int N, int64_t n0, int lane, Out* y,
                                                int64_t ldy, bool accumulate) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (m >= M || n0 + r >= N) continue;
      const float sum = warp_sum(acc[r][m]);
      if (lane == 0) {
        Out* dst = y + m * ldy + n0 + r;
        *dst = from_f32<Out>(accumulate ? to_f32(*dst) + sum : sum);
      }
    }
}

template <int MT, int R, typename Out>
__global__ void __launch_bounds__(kWarps * 32)
    skinny_vec_kernel(const __nv_bfloat16* __restrict__ x, int64_t ldx, const __nv_bfloat16* __restrict__ w,
                      int64_t ldw, Out* __restrict__ y, int64_t ldy, int M, int N, int K, bool accumulate) {
  grid_dependency_begin();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n0 = (int64_t(blockIdx.x) * kWarps + warp) * R;
  if (n0 >= N) return;
  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.f;
  const uint4* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wrow[r] = reinterpret_cast<const uint4*>(w + (n0 + r < N ? n0 + r : n0) * ldw);
  const int chunks = K / 8;

  auto consume = [&](const uint4 (&wv)[R], int c) {
    float wf[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) unpack_bf16x8(wv[r], wf[r]);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (m < M) {
        float xf[8];
        unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(x + m * ldx) + c), xf);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r][m] = __fmaf_rn(wf[r][e], xf[e], acc[r][m]);
      }
    }
  };

  int c = lane;
  for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
    uint4 wv[kUnroll][R];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = __ldg(wrow[r] + c + 32 * u);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) consume(wv[u], c + 32 * u);
  }
  for (; c < chunks; c += 32) {
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r] = __ldg(wrow[r] + c);
    consume(wv, c);
  }

  store_lane_sums<MT, R>(acc, M, N, n0, lane, y, ldy, accumulate);
}

// Any K, any alignment (tiny models, odd views): one element per lane per step. Slow, rare.
template <typename Out>
__global__ void skinny_scalar_kernel(const __nv_bfloat16* __restrict__ x, int64_t ldx,
                                     const __nv_bfloat16* __restrict__ w, int64_t ldw, Out* __restrict__ y,
                                     int64_t ldy, int M, int N, int K, bool accumulate) {
  grid_dependency_begin();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n = int64_t(blockIdx.x) * kWarps + warp;
  if (n >= N) return;
  for (int m = 0; m < M; ++m) {
    float acc = 0.f;
    for (int k = lane; k < K; k += 32)
      acc = __fmaf_rn(__bfloat162float(w[n * ldw + k]), __bfloat162float(x[m * ldx + k]), acc);
    acc = warp_sum(acc);
    if (lane == 0) {
      Out* dst = y + m * ldy + n;
      *dst = from_f32<Out>(accumulate ? to_f32(*dst) + acc : acc);
    }
  }
}

// Several rows of x (verification and drafting blocks): the same per-output arithmetic as
// skinny_vec_kernel (lane L sums chunks L, L+32, … in ascending order, eight FMAs per chunk,
// then the same butterfly), so a row gives the same bits here as alone through the M = 1
// kernel. What changes is where x comes from: a tile of kTileChunks chunks of every row of x
// is staged in shared memory once per block, instead of every warp fetching all of x through
// L1/L2 once per chunk, and the tile's weight loads are issued before the barrier so they are
// in flight while x is staged.
constexpr int kTileChunks = 128;  // 1024 elements of K per tile
constexpr int kTileSteps = kTileChunks / 32;

template <int MT, int R, typename Out>
__global__ void __launch_bounds__(kWarps * 32)
    skinny_tiled_kernel(const __nv_bfloat16* __restrict__ x, int64_t ldx, const __nv_bfloat16* __restrict__ w,
                        int64_t ldw, Out* __restrict__ y, int64_t ldy, int M, int N, int K, bool accumulate) {
  extern __shared__ uint4 xs[];  // [MT][kTileChunks]
  grid_dependency_begin();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n0 = (int64_t(blockIdx.x) * kWarps + warp) * R;
  const bool active = n0 < N;  // an idle warp still takes part in staging and barriers
  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.f;
  const uint4* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t n = n0 + r < N ? n0 + r : N - 1;
    wrow[r] = reinterpret_cast<const uint4*>(w + n * ldw);
  }
  const int chunks = K / 8;
  for (int t0 = 0; t0 < chunks; t0 += kTileChunks) {
    const int tc = chunks - t0 < kTileChunks ? chunks - t0 : kTileChunks;
    uint4 wv[kTileSteps][R];
#pragma unroll
    for (int u = 0; u < kTileSteps; ++u) {
      const int c = u * 32 + lane;
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = active && c < tc ? __ldg(wrow[r] + t0 + c) : make_uint4(0, 0, 0, 0);
    }
    __syncthreads();  // every warp is done with the previous tile of x
    for (int i = threadIdx.x; i < M * tc; i += blockDim.x) {
      const int m = i / tc, c = i % tc;
      xs[m * kTileChunks + c] = __ldg(reinterpret_cast<const uint4*>(x + m * ldx) + t0 + c);
    }
    __syncthreads();
    if (!active) continue;
#pragma unroll
    for (int u = 0; u < kTileSteps; ++u) {
      const int c = u * 32 + lane;
      if (c >= tc) break;
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) unpack_bf16x8(wv[u][r], wf[r]);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m < M) {
          float xf[8];
          unpack_bf16x8(xs[m * kTileChunks + c], xf);
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r][m] = __fmaf_rn(wf[r][e], xf[e], acc[r][m]);
        }
      }
    }
  }
  if (!active) return;
  store_lane_sums<MT, R>(acc, M, N, n0, lane, y, ldy, accumulate);
}

template <int MT, typename Out>
void launch_tiled(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy, int M, int N, int K,
                  bool accumulate, cudaStream_t s) {
  constexpr int R = MT >= 32 ? 2 : 4;
  constexpr size_t smem = size_t(MT) * kTileChunks * sizeof(uint4);
  auto kernel = skinny_tiled_kernel<MT, R, Out>;
  if constexpr (smem > 48 * 1024) {
    // Above 48 KB a kernel must opt in to its dynamic shared memory, once.
    static const cudaError_t opted =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    check(opted, "matmul (skinny)", "raising the shared-memory limit");
  }
  launch_kernel("matmul (skinny)", kernel, blocks_for(N, kWarps * R), kWarps * 32, smem, s,
                static_cast<const __nv_bfloat16*>(x), ldx, static_cast<const __nv_bfloat16*>(w), ldw,
                static_cast<Out*>(y), ldy, M, N, K, accumulate);
}

template <int MT, typename Out>
void launch_vec(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy, int M, int N, int K,
                bool accumulate, cudaStream_t s) {
  // More rows of w per warp when M is large: each x chunk fetched is used R times.
  constexpr int R = MT >= 32 ? 2 : MT >= 8 ? 4 : MT >= 2 ? 2 : 1;
  const unsigned blocks = blocks_for(N, kWarps * R);
  launch_kernel("matmul (skinny)", skinny_vec_kernel<MT, R, Out>, blocks, kWarps * 32, 0, s,
                static_cast<const __nv_bfloat16*>(x), ldx, static_cast<const __nv_bfloat16*>(w), ldw,
                static_cast<Out*>(y), ldy, M, N, K, accumulate);
}

}  // namespace

void skinny_matmul(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy, Elem y_elem, int M,
                   int N, int K, bool accumulate, bool w_uploaded, cudaStream_t s, const SkinnyNorm* norm,
                   const void* w_tiled) {
  if (M == 0 || N == 0) return;
  if (M > kSkinnyMaxRows) throw Error("cuda matmul: skinny kernel called with " + std::to_string(M) + " rows");
  // Every decision here reads N, K, pointers and strides, never M (see the top of the file).
  // x's alignment is judged from its stride: a row sliced out of a block is aligned iff the
  // block is, so a row alone and in its block take the same path.
  const bool vec = K % 8 == 0 && rows_aligned16(x, ldx, 2) && rows_aligned16(w, ldw, 2);
  const MmaSettings& ms = mma_settings();
  const bool mma = vec && K % 32 == 0 && ms.enabled;
  const MmaTiling tl = mma_tiling(N, K, ms.target_warps, ms.block_slots);
  if (norm) {
    if (!mma) throw Error("cuda matmul: a deferred norm on a product without the tensor-core kernel");
    if (norm->partial_out && (y_elem != Elem::F32 || !accumulate))
      throw Error("cuda matmul: only the f32 residual stream emits a deferred norm");
    if (norm->partial_out) {
      dispatch_mma<float, kEpiEmitNorm>(x, ldx, w, ldw, y, ldy, M, N, K, tl, accumulate, w_uploaded, *norm, s, w_tiled);
      return;
    }
  }
  dispatch_elem(y_elem, [&](auto yi) {
    using Out = decltype(yi);
    if (norm) {
      dispatch_mma<Out, kEpiScaleInv>(x, ldx, w, ldw, y, ldy, M, N, K, tl, accumulate, w_uploaded, *norm, s, w_tiled);
    } else if (mma) {
      dispatch_mma<Out, kEpiPlain>(x, ldx, w, ldw, y, ldy, M, N, K, tl, accumulate, w_uploaded, SkinnyNorm{}, s,
                                   w_tiled);
    } else if (!vec) {
      launch_kernel("matmul (skinny)", skinny_scalar_kernel<Out>, blocks_for(N, kWarps), kWarps * 32, 0, s,
          static_cast<const __nv_bfloat16*>(x), ldx, static_cast<const __nv_bfloat16*>(w), ldw, static_cast<Out*>(y),
          ldy, M, N, K, accumulate);
    } else if (M <= 1) {
      launch_vec<1, Out>(x, ldx, w, ldw, y, ldy, M, N, K, accumulate, s);
    } else if (M <= 2) {
      launch_vec<2, Out>(x, ldx, w, ldw, y, ldy, M, N, K, accumulate, s);
    } else if (M <= 4) {
      launch_tiled<4, Out>(x, ldx, w, ldw, y, ldy, M, N, K, accumulate, s);
    } else if (M <= 8) {
      launch_tiled<8, Out>(x, ldx, w, ldw, y, ldy, M, N, K, accumulate, s);
    } else if (M <= 16) {
      launch_tiled<16, Out>(x, ldx, w, ldw, y, ldy, M, N, K, accumulate, s);
    } else {
      launch_tiled<32, Out>(x, ldx, w, ldw, y, ldy, M, N, K, accumulate, s);
    }
  });
}

bool skinny_mma_applies(const void* x, int64_t ldx, const void* w, int64_t ldw, int K) {
  return mma_settings().enabled && K % 32 == 0 && rows_aligned16(x, ldx, 2) && rows_aligned16(w, ldw, 2);
}

int skinny_norm_parts(int N, int K) {
  const MmaTiling tl = mma_tiling(N, K, mma_settings().target_warps, mma_settings().block_slots);
  return static_cast<int>(mma_blocks(N, tl.NT, tl.S, false));
}

namespace {
template <int PRE>
void launch_argmax_kernel(const void* x, int64_t ldx, const void* w, int64_t ldw, float* y, int64_t ldy, int M, int N,
                          int K, int S, bool prewait, const SkinnyNorm& norm, int64_t tiles, int64_t slots,
                          const RowArgmax& arg, cudaStream_t s) {
  const MmaSettings& ms = mma_settings();
  constexpr auto kernel = skinny_mma_persistent_kernel<1, 2, float, kEpiScaleInv, false, false, PRE, true>;
  default_carveout<kernel>(kSkinnyCarveout, "matmul (skinny)");
  launch_kernel("matmul (skinny)", kernel, unsigned(slots), kWarps * 32, 0, s, static_cast<const __nv_bfloat16*>(x),
                ldx, static_cast<const __nv_bfloat16*>(w), ldw, y, ldy, M, N, K, S, false, norm, prewait, ms.early_y,
                static_cast<int>(tiles), sched_counter(s), ms.rotate, ms.cross_tile, arg);
}
}  // namespace

bool skinny_argmax_applies(const void* x, int64_t ldx, const void* w, int64_t ldw, int M, int N, int K) {
  return skinny_matmul_argmax(x, ldx, w, ldw, nullptr, 0, M, N, K, false, SkinnyNorm{}, nullptr, 1, nullptr, nullptr);
}

size_t skinny_argmax_scratch_bytes(int M) {
  const int64_t slots = persistent_slots<1, 2, float, kEpiScaleInv, false, false, true>();
  return size_t(std::max<int>(M, 1)) * size_t(std::max<int64_t>(slots, 1)) * (sizeof(float) + sizeof(int));
}

bool skinny_matmul_argmax(const void* x, int64_t ldx, const void* w, int64_t ldw, float* y, int64_t ldy, int M, int N,
                          int K, bool w_uploaded, const SkinnyNorm& norm, int32_t* ids, int64_t ld_ids, void* scratch,
                          cudaStream_t s) {
  const MmaSettings& ms = mma_settings();
  if (M < 1 || M > 16 || N <= 0 || !skinny_mma_applies(x, ldx, w, ldw, K) || ms.persist != 2) return false;
  // The plain product's tiling, so that the logits (and so the ids) are those of skinny_matmul.
  const MmaTiling tl = mma_tiling(N, K, ms.target_warps, ms.block_slots);
  const int block_cols = (kWarps / tl.S) * tl.NT * 8;
  const int64_t tiles = mma_blocks(N, tl.NT, tl.S, false);
  const int64_t slots = persistent_slots<1, 2, float, kEpiScaleInv, false, false, true>();
  if (tl.NT != 2 || tiles <= slots || int64_t(M) * block_cols > kArgSlots) return false;
  if (!ids) return true;  // the question only (skinny_argmax_applies)
  RowArgmax arg;
  arg.ids = ids;
  arg.ld_ids = ld_ids;
  arg.part_v = static_cast<float*>(scratch);
  arg.part_i = reinterpret_cast<int*>(arg.part_v + int64_t(M) * slots);
  arg.ticket = argmax_ticket(s);
  arg.store_y = y != nullptr;
  const bool prewait = w_uploaded && ms.prewait != 0;
  if (prewait && prewait_batches(ms, N, K, tl.S, tl.NT, true) == 2)
    launch_argmax_kernel<2>(x, ldx, w, ldw, y, ldy, M, N, K, tl.S, prewait, norm, tiles, slots, arg, s);
  else
    launch_argmax_kernel<1>(x, ldx, w, ldw, y, ldy, M, N, K, tl.S, prewait, norm, tiles, slots, arg, s);
  return true;
}

bool skinny_silu_pair_supported(const void* x, int64_t ldx, const void* w, int64_t ldw, int N, int K) {
  return mma_settings().enabled && K % 32 == 0 && N > 0 && N % 2 == 0 && rows_aligned16(x, ldx, 2) &&
         rows_aligned16(w, ldw, 2);
}

void skinny_matmul_silu_mul(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy, int M,
                            int N, int K, bool w_uploaded, cudaStream_t s, const SkinnyNorm* norm, const void* w_tiled) {
  if (M == 0 || N == 0) return;
  if (M > kSkinnyMaxRows) throw Error("cuda matmul_silu_mul: skinny kernel called with " + std::to_string(M) + " rows");
  if (!skinny_silu_pair_supported(x, ldx, w, ldw, N, K))
    throw Error("cuda matmul_silu_mul: the paired kernel called where it does not apply");
  // The K slices the plain product of this weight takes (its tile width does not change a sum).
  const int S = mma_tiling(N, K, mma_settings().target_warps, mma_settings().block_slots).S;
  // The four instantiations (m16 tiles, a consumed norm or none) of one weight layout.
  auto launch = [&](auto tiled, const void* wp) {
    constexpr bool T = decltype(tiled)::value;
    const SkinnyNorm none{};
    if (norm && M <= 16)
      launch_mma<1, 2, __nv_bfloat16, kEpiScaleInv, true, T>(x, ldx, wp, ldw, y, ldy, M, N, K, S, false, w_uploaded,
                                                               *norm, s);
    else if (norm)
      launch_mma<2, 2, __nv_bfloat16, kEpiScaleInv, true, T>(x, ldx, wp, ldw, y, ldy, M, N, K, S, false, w_uploaded,
                                                               *norm, s);
    else if (M <= 16)
      launch_mma<1, 2, __nv_bfloat16, kEpiPlain, true, T>(x, ldx, wp, ldw, y, ldy, M, N, K, S, false, w_uploaded,
                                                            none, s);
    else
      launch_mma<2, 2, __nv_bfloat16, kEpiPlain, true, T>(x, ldx, wp, ldw, y, ldy, M, N, K, S, false, w_uploaded,
                                                            none, s);
  };
  // Gate and up rows start on n8 tiles of the pre-tiled copy only where N / 2 is a multiple of 8.
  if (w_tiled && (N / 2) % 8 == 0) launch(std::true_type{}, w_tiled);
  else launch(std::false_type{}, w);
}

namespace {
// One thread a 16-byte piece of the tiled copy: piece u is lane l = u % 32 of chunk c of n8 tile
// τ, that is row 8τ + l / 4, elements 32c + 8(l % 4) … + 7 (zeros past the last row).
__global__ void tile_weight_kernel(const uint4* __restrict__ w, int64_t rows, int64_t ld_units, int chunks,
                                   uint4* __restrict__ tiled, int64_t pieces) {
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < pieces; u += int64_t(gridDim.x) * blockDim.x) {
    const int64_t tau = u / (int64_t(chunks) * 32);
    const int rem = int(u % (int64_t(chunks) * 32)), c = rem / 32, l = rem % 32;
    const int64_t row = tau * 8 + l / 4;
    tiled[u] = row < rows ? w[row * ld_units + 4 * c + l % 4] : make_uint4(0, 0, 0, 0);
  }
}
}  // namespace

bool skinny_tiles(int64_t rows, int64_t cols, int64_t ld) {
  return rows > 0 && cols % 32 == 0 && ld % 8 == 0 && cols <= INT32_MAX;
}

size_t skinny_tiled_bytes(int64_t rows, int64_t cols) { return size_t((rows + 7) / 8 * 8) * size_t(cols) * 2; }

void skinny_tile_weight(const void* w, int64_t rows, int64_t cols, int64_t ld, void* tiled, cudaStream_t s) {
  if (!skinny_tiles(rows, cols, ld))
    throw Error("cuda: a weight of " + std::to_string(rows) + " x " + std::to_string(cols) + " (row stride " +
                std::to_string(ld) + ") cannot be tiled: it needs columns in multiples of 32, a stride of 8");
  const int64_t pieces = int64_t(skinny_tiled_bytes(rows, cols) / 16);
  const unsigned blocks = unsigned(std::min<int64_t>((pieces + 255) / 256, 65535));
  tile_weight_kernel<<<blocks, 256, 0, s>>>(static_cast<const uint4*>(w), rows, ld / 8, int(cols / 32),
                                            static_cast<uint4*>(tiled), pieces);
  check(cudaGetLastError(), "upload_weight", "tile_weight_kernel launch");
}

}  // namespace dflash::cuda
