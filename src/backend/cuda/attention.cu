// Attention, two paths chosen by the number of query rows T:
//
// - T ≤ kAttentionSplitMaxRows (decode, verification blocks, the drafter's block, short
//   prompts): split-KV ("flash-decoding"). Keys are cut into chunks of kChunk at absolute
//   positions (chunk c holds keys c·kChunk …), one block per (chunk, KV head, tile of query
//   rows × the group's query heads), so K/V of a chunk are staged in shared memory once and
//   serve every query head of the GQA group and every row of the tile. Tiles are small (about
//   16 queries: 4 rows × 4 heads for Qwen3-8B) so the grid has many blocks; other row tiles
//   re-read the chunk from L2. Each block writes, per (row, head, chunk), the chunk's max score,
//   its sum of exp2 and the unnormalised output in f32 scratch; a second launch merges the
//   chunks of each (row, head) in chunk order, one warp per (row, head).
//   A chunk's scores and P·V run on the tensor cores (split_chunk_mma) where the build and the
//   head size allow, on CUDA cores otherwise (split_chunk); a process uses one of the two.
// - Larger T (prefill, attention_prefill.cu): flash attention on the tensor cores
//   (prefill_attention_kernel) where the head size and alignment allow; otherwise one block
//   per (query row, head).
//
// Batch invariance: in the split path every number a row produces is a function of its query,
// its visible key count and the keys themselves. Chunk boundaries are absolute positions and
// the last chunk stops at the row's own visible count, so a row decoded alone (kv_len equal to
// its visible count) and the same row inside a verification block (larger kv_len, the same
// causal count) see the same chunks. Inside a chunk each dot product runs over d in order, the
// max is exact, the sum of exp2 is one fixed butterfly, each output element sums its keys in
// order; how rows and heads are tiled onto blocks and threads only decides who computes a
// number, never how. The merge walks chunks 0, 1, … in order. Decode (T = 1) and
// verification (T ≤ 32) therefore share one arithmetic, bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

using namespace attention_internal;

// Split path. 64 keys per chunk: a decode step over 512 cached rows still makes
// 8 chunks × KV heads blocks, while the f32 scratch (D + 2 floats per row, head and chunk,
// written once and read once) stays small beside the K/V bytes it summarises: 1/8 of them for
// one row at D = 128 with four query heads per KV head. The softmax takes two keys per lane,
// which fixes the value at 64.
constexpr int kChunk = 64;
// Warps of a split block (DFLASH_ATTN_WARPS=4 instead, to measure): either count gives the
// same numbers, more warps split a block's serial work (see split_chunk_mma).
constexpr int kSplitWarps = 8;
static_assert(kChunk == 64, "split_kernel's softmax assumes two keys per lane");

__device__ __forceinline__ int64_t visible_keys(int64_t t, int64_t kv_len, int64_t q_pos0, bool causal) {
  return causal && q_pos0 + t + 1 < kv_len ? q_pos0 + t + 1 : kv_len;
}

// How many keys of the chunk starting at c0 a row with `visible` keys sees (0 … kChunk).
__device__ __forceinline__ int keys_in_chunk(int64_t visible, int64_t c0) {
  const int64_t n = visible - c0;
  return n <= 0 ? 0 : n >= kChunk ? kChunk : static_cast<int>(n);
}

struct SplitArgs : AttentionOperands {
  float2* part_ml;  // [T·hq·nc]: (max, sum of exp2) per (row, head, chunk)
  float* part_o;    // [T·hq·nc, D]: unnormalised output per (row, head, chunk)
  int hq, D, D8, nc;
  int rows_per_block, heads_per_block, head_tiles;
  bool vec;
  bool qvec;  // q rows 16-byte aligned (D % 8 == 0): the tensor-core path loads them 8 at a time
  bool mma;  // split_chunk_mma (tensor cores) instead of split_chunk
  bool dependents_first;  // the merge lets its dependents in before its wait (kDecodeSplitCarveout)
  // Measuring only (DFLASH_ATTN_DIAG; the results are then wrong): stages split_chunk_mma leaves
  // out, a sum of 1 K/V staging, 2 the q load, 4 the scores, 8 the softmax, 16 P·V, 32 P·V's
  // low-part mma's, 64 the partial-output stores.
  int diag;
};

// Shared memory of one split block: K and V of the chunk as bf16 rows of D8 + 8 elements (the
// pad staggers rows across banks for the one-key-per-lane reads), the tile's queries as f32
// rows of D8 (zero-padded), then a score/probability row of kChunk per query.
__host__ __device__ constexpr int split_row_stride(int D8) { return D8 + 8; }
__host__ __device__ constexpr size_t split_smem_bytes(int D8, int nq4) {
  return size_t(2) * kChunk * split_row_stride(D8) * 2 + size_t(nq4) * D8 * 4 + size_t(nq4) * kChunk * 4;
}

// Σ_j p_j · v_j for QV queries of the tile at once (they share the value loads) and four
// elements of the head dimension; each output element still sums its own keys j = 0, 1, …
// in order, so QV changes only which thread computes a number.
template <int QV>
__device__ __forceinline__ void split_pv(const SplitArgs& a, const __nv_bfloat16* Vs, const float* Ss, int nq,
                                         int hg, int64_t t0, int h_base, int c, int64_t c0) {
  const int Dp = split_row_stride(a.D8), n_d4 = (a.D + 3) / 4;
  const int items = (nq + QV - 1) / QV * n_d4;
  for (int i = threadIdx.x; i < items; i += int(blockDim.x)) {
    const int d0 = (i % n_d4) * 4, qv0 = (i / n_d4) * QV;
    int nv[QV], nv_max = 0;
#pragma unroll
    for (int u = 0; u < QV; ++u) {
      const int qv = qv0 + u;
      nv[u] = qv < nq ? keys_in_chunk(visible_keys(t0 + qv / hg, a.kv_len, a.q_pos0, a.causal), c0) : 0;
      nv_max = max(nv_max, nv[u]);
    }
    float acc[QV][4];
#pragma unroll
    for (int u = 0; u < QV; ++u)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[u][e] = 0.f;
    for (int j = 0; j < nv_max; ++j) {
      const uint2 raw = *reinterpret_cast<const uint2*>(Vs + j * Dp + d0);
      const float vf[4] = {__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u),
                           __uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xffff0000u)};
#pragma unroll
      for (int u = 0; u < QV; ++u) {
        if (j < nv[u]) {  // a row's sum stops at its own last visible key
          const float p = Ss[(qv0 + u) * kChunk + j];
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[u][e] = fmaf(p, vf[e], acc[u][e]);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < QV; ++u) {
      if (nv[u] == 0) continue;
      const int qv = qv0 + u;
      const int64_t t = t0 + qv / hg;
      const int h = h_base + qv % hg;
      float* dst = a.part_o + ((t * a.hq + h) * a.nc + c) * a.D + d0;
      if (a.D % 4 == 0) {
        *reinterpret_cast<float4*>(dst) = make_float4(acc[u][0], acc[u][1], acc[u][2], acc[u][3]);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (d0 + e < a.D) dst[e] = acc[u][e];
      }
    }
  }
}

// f(row, element) for every 16-byte segment (8 bf16 elements) of `rows` rows of `segs`
// segments, spread over the block. When the block's threads are a multiple of segs (head_dim
// 128 or 256 and any block size here) each thread keeps one column and divides once: the
// division per segment was a fifth of the split kernel's instructions (ncu, H200, 2026-11-30).
template <typename F>
__device__ __forceinline__ void for_row_segments(int rows, int segs, F&& f) {
  const int threads = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  if (threads % segs == 0) {
    const int step = threads / segs, s8 = (tid % segs) * 8;
    for (int j = tid / segs; j < rows; j += step) f(j, s8);
  } else {
    for (int i = tid; i < rows * segs; i += threads) f(i / segs, (i % segs) * 8);
  }
}

// K and V rows 0 … n_load − 1 of the chunk into shared memory (rows of stride Dp) with
// asynchronous 16-byte copies (D % 8 == 0, aligned rows), K and V as separate commit groups so
// the scores can start while V is still in flight (copies issued before this join K's group).
__device__ __forceinline__ void stage_chunk_kv(const SplitArgs& a, __nv_bfloat16* Ks, __nv_bfloat16* Vs, int Dp,
                                               const __nv_bfloat16* kb, const __nv_bfloat16* vb, int n_load) {
  const int segs = a.D / 8;
  for_row_segments(n_load, segs, [&](int j, int s8) { cp_async16(Ks + j * Dp + s8, kb + j * a.ldk + s8); });
  cp_async_commit();
  for_row_segments(n_load, segs, [&](int j, int s8) { cp_async16(Vs + j * Dp + s8, vb + j * a.ldv + s8); });
  cp_async_commit();
}

// Softmax of each query over its keys of the chunk, in place on its row of Ss (scores in, the
// unnormalised probabilities out, 0 past its visible keys), and the chunk's (max, sum) into
// part_ml: one warp per query, keys lane and lane + 32. The max is exact in any order; the sum
// is the fixed butterfly of warp_sum. A query that sees no key of the chunk is left alone.
__device__ __forceinline__ void chunk_softmax(const SplitArgs& a, float* Ss, int nq, int hg, int64_t t0, int h_base,
                                              int c, int64_t c0, int ss_stride = kChunk) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int qv = warp; qv < nq; qv += int(blockDim.x) / 32) {
    const int64_t t = t0 + qv / hg;
    const int nv = keys_in_chunk(visible_keys(t, a.kv_len, a.q_pos0, a.causal), c0);
    if (nv == 0) continue;  // this chunk is past the row's last key
    float* srow = Ss + qv * ss_stride;
    const float sa = lane < nv ? srow[lane] : -INFINITY;
    const float sb = lane + 32 < nv ? srow[lane + 32] : -INFINITY;
    const float m = warp_max(fmaxf(sa, sb));  // finite: key 0 of the chunk is visible
    const float pa = lane < nv ? exp2f(sa - m) : 0.f;
    const float pb = lane + 32 < nv ? exp2f(sb - m) : 0.f;
    srow[lane] = pa;
    srow[lane + 32] = pb;
    const float l = warp_sum(pa + pb);
    if (lane == 0) a.part_ml[(t * a.hq + h_base + qv % hg) * a.nc + c] = make_float2(m, l);
  }
}

// The work of one split block on its chunk: scores, softmax and P·V of the tile's queries
// against the chunk's keys, written to part_ml / part_o. n_load > 0 keys of the chunk are
// visible to the tile's last row.
__device__ __forceinline__ void split_chunk(const SplitArgs& a, unsigned char* smem, int c, int kvh, int64_t t0,
                                            int rows, int hg, int h_base, int64_t c0, int n_load) {
  const int D = a.D, D8 = a.D8, Dp = split_row_stride(D8);
  const int nq = rows * hg, nq4 = (nq + 3) / 4 * 4;
  auto* Ks = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* Vs = Ks + kChunk * Dp;
  auto* Qs = reinterpret_cast<float*>(Vs + kChunk * Dp);
  float* Ss = Qs + nq4 * D8;

  const __nv_bfloat16* kb = a.k + c0 * a.ldk + int64_t(kvh) * D;
  const __nv_bfloat16* vb = a.v + c0 * a.ldv + int64_t(kvh) * D;
  if (a.vec) {  // D % 8 == 0, so D8 == D
    stage_chunk_kv(a, Ks, Vs, Dp, kb, vb, n_load);
  } else {
    // Zero padding up to D8: the score loop then reads whole 8-element groups.
    const __nv_bfloat16 zero = __float2bfloat16_rn(0.f);
    for (int i = threadIdx.x; i < n_load * D8; i += int(blockDim.x)) {
      const int j = i / D8, d = i % D8;
      Ks[j * Dp + d] = d < D ? kb[j * a.ldk + d] : zero;
      Vs[j * Dp + d] = d < D ? vb[j * a.ldv + d] : zero;
    }
  }
  // Queries, scaled by head_dim^-0.5 · log2(e) once so the softmax runs on exp2; rows of the
  // last group of four past nq are zeros (their scores are computed and ignored).
  for (int i = threadIdx.x; i < nq4 * D8; i += int(blockDim.x)) {
    const int qv = i / D8, d = i % D8;
    float x = 0.f;
    if (qv < nq && d < D)
      x = __bfloat162float(a.q[(t0 + qv / hg) * a.ldq + int64_t(h_base + qv % hg) * D + d]) * a.scale_log2;
    Qs[i] = x;
  }
  if (a.vec) cp_async_wait<1>();
  __syncthreads();

  // Scores: one key per thread against four queries (broadcast reads of q, one read of the key
  // row per 8 elements); every dot product runs d = 0 … D8 − 1 in order.
  for (int i = threadIdx.x; i < nq4 / 4 * kChunk; i += int(blockDim.x)) {
    const int j = i % kChunk, q4 = i / kChunk;
    if (j >= n_load) continue;
    const __nv_bfloat16* kr = Ks + j * Dp;
    const float* qr = Qs + q4 * 4 * D8;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int d = 0; d < D8; d += 8) {
      float kf[8];
      unpack_bf16x8(*reinterpret_cast<const uint4*>(kr + d), kf);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float4 lo = *reinterpret_cast<const float4*>(qr + u * D8 + d);
        const float4 hi = *reinterpret_cast<const float4*>(qr + u * D8 + d + 4);
        float s = acc[u];
        s = fmaf(lo.x, kf[0], s);
        s = fmaf(lo.y, kf[1], s);
        s = fmaf(lo.z, kf[2], s);
        s = fmaf(lo.w, kf[3], s);
        s = fmaf(hi.x, kf[4], s);
        s = fmaf(hi.y, kf[5], s);
        s = fmaf(hi.z, kf[6], s);
        s = fmaf(hi.w, kf[7], s);
        acc[u] = s;
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) Ss[(q4 * 4 + u) * kChunk + j] = acc[u];
  }
  __syncthreads();

  chunk_softmax(a, Ss, nq, hg, t0, h_base, c, c0);
  if (a.vec) cp_async_wait<0>();
  __syncthreads();

  // A decode step has a handful of queries: one per thread item keeps the block busy.
  // Verification tiles have up to 64: four per item share each value load.
  if (nq <= 8) split_pv<1>(a, Vs, Ss, nq, hg, t0, h_base, c, c0);
  else split_pv<4>(a, Vs, Ss, nq, hg, t0, h_base, c, c0);
}

// The tensor-core split's score rows are kChunk + 8 floats, not kChunk. With rows of kChunk (256
// bytes) the mma fragments' rows g = lane / 4 all fall on the same banks, so each score store and
// each probability load of P·V was an 8-way bank conflict (4-way a half-warp for the 64-bit
// loads); 8 floats of padding put a half-warp's four rows on disjoint banks, and the scores are
// stored as float2. The same numbers in the same order (H200, thirtieth pass: a step 0.9 % and
// 1.9 % shorter at 4096 cached rows in two calls, level at 512; docs/benchmarks.md).
constexpr int kScoreRow = kChunk + 8;

// Shared memory of one tensor-core split block: K and V as in split_chunk, then the queries as
// bf16 rows of D8 + 8 for whole m16 tiles (rows past the tile's queries zero), then f32 scores
// and probabilities for those rows (kScoreRow floats each).
__host__ __device__ constexpr size_t split_mma_smem_bytes(int D8, int nq) {
  return size_t(2) * kChunk * split_row_stride(D8) * 2 + size_t((nq + 15) / 16 * 16) * split_row_stride(D8) * 2 +
         size_t((nq + 15) / 16 * 16) * kScoreRow * 4;
}

// split_chunk on the tensor cores (sm_80+, D % 16 == 0, aligned K/V rows): the scores and P·V
// as m16n8k16 bf16 products with f32 accumulation, the softmax between them as in split_chunk.
// Scores: S = q·kᵀ from the bf16 values as stored (products exact in f32), then scaled by
// head_dim^-0.5 · log2(e). P·V: each probability is split into bf16 hi + lo parts (p − hi is
// exact in f32 and its bf16 rounding leaves ~2^-16 of p), so P·V keeps about f32 accuracy.
// Batch invariance as in split_chunk: an mma computes each row of its result from that row of
// A alone, every k step is taken in order, probabilities past a row's visible keys are exact
// zeros and the V rows past the loaded keys are zeroed, so a row's partials depend only on its
// query, its visible count and the keys. Of W warps, warp w computes the scores of keys
// (64/W)·w … (64/W)·(w + 1) − 1 and the output columns 8(w + W·i) … of every m16 tile.
template <int W>
__device__ __forceinline__ void split_chunk_mma(const SplitArgs& a, unsigned char* smem, int c, int kvh, int64_t t0,
                                                int rows, int hg, int h_base, int64_t c0, int n_load) {
  const int D = a.D, Dp = split_row_stride(a.D8);
  const int nq = rows * hg, mtiles = (nq + 15) / 16;
  auto* Ks = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* Vs = Ks + kChunk * Dp;
  __nv_bfloat16* Qs = Vs + kChunk * Dp;
  auto* Ss = reinterpret_cast<float*>(Qs + mtiles * 16 * Dp);

  const int segs = D / 8;
  // The queries first, as asynchronous copies in K's commit group: they were written by the
  // kernel just before (an L2 round trip), and a load here used to wait alone before the K/V
  // copies could be waited for.
  if (!(a.diag & 2) && a.qvec) {
    for_row_segments(mtiles * 16, segs, [&](int qv, int s8) {
      if (qv < nq) cp_async16(Qs + qv * Dp + s8, a.q + (t0 + qv / hg) * a.ldq + int64_t(h_base + qv % hg) * D + s8);
      else *reinterpret_cast<uint4*>(Qs + qv * Dp + s8) = make_uint4(0, 0, 0, 0);
    });
  }
  if (!(a.diag & 1)) {
    stage_chunk_kv(a, Ks, Vs, Dp, a.k + c0 * a.ldk + int64_t(kvh) * D, a.v + c0 * a.ldv + int64_t(kvh) * D, n_load);
  } else {
    cp_async_commit();  // the queries' group (measuring only), then an empty one for V
    cp_async_commit();
  }
  // V rows past the loaded keys meet probabilities of exactly 0, which must not meet NaNs.
  for_row_segments(kChunk - n_load, segs, [&](int j, int s8) {
    *reinterpret_cast<uint4*>(Vs + (n_load + j) * Dp + s8) = make_uint4(0, 0, 0, 0);
  });
  if (a.diag & 2 || a.qvec) {
  } else {
    const __nv_bfloat16 zero = __float2bfloat16_rn(0.f);
    for (int i = threadIdx.x; i < mtiles * 16 * D; i += int(blockDim.x)) {
      const int qv = i / D, d = i % D;
      Qs[qv * Dp + d] = qv < nq ? a.q[(t0 + qv / hg) * a.ldq + int64_t(h_base + qv % hg) * D + d] : zero;
    }
  }
  cp_async_wait<1>();
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  constexpr int kKeys = kChunk / W, kTiles = kKeys / 8;
  static_assert(kKeys % 8 == 0, "split_chunk_mma: whole n8 tiles of keys per warp");
  for (int mt = 0; mt < (a.diag & 4 ? 0 : mtiles); ++mt) {
    float acc[kTiles][4] = {};
    for (int k0 = 0; k0 < D; k0 += 16) {
      const __nv_bfloat16* qa = Qs + (mt * 16 + g) * Dp + k0 + 2 * t;
      const uint32_t a0 = *reinterpret_cast<const uint32_t*>(qa);
      const uint32_t a1 = *reinterpret_cast<const uint32_t*>(qa + 8 * Dp);
      const uint32_t a2 = *reinterpret_cast<const uint32_t*>(qa + 8);
      const uint32_t a3 = *reinterpret_cast<const uint32_t*>(qa + 8 * Dp + 8);
#pragma unroll
      for (int nt = 0; nt < kTiles; ++nt) {
        const __nv_bfloat16* kr = Ks + (warp * kKeys + nt * 8 + g) * Dp + k0 + 2 * t;
        mma_bf16_16x8x16(acc[nt], a0, a1, a2, a3, *reinterpret_cast<const uint32_t*>(kr),
                         *reinterpret_cast<const uint32_t*>(kr + 8));
      }
    }
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<float2*>(Ss + (mt * 16 + g + half * 8) * kScoreRow + warp * kKeys + nt * 8 + 2 * t) =
            make_float2(acc[nt][2 * half] * a.scale_log2, acc[nt][2 * half + 1] * a.scale_log2);
  }
  __syncthreads();

  if (!(a.diag & 8)) chunk_softmax(a, Ss, nq, hg, t0, h_base, c, c0, kScoreRow);
  cp_async_wait<0>();
  __syncthreads();
  if (a.diag & 16) return;

  const int dtiles = D / 8;
  constexpr int kMaxTilesPerWarp = kMaxHeadDim / 8 / W;
  static_assert(kMaxTilesPerWarp % 2 == 0, "V fragments are loaded for two tiles at a time");
  for (int mt = 0; mt < mtiles; ++mt) {
    float acc[kMaxTilesPerWarp][4];
#pragma unroll
    for (int i = 0; i < kMaxTilesPerWarp; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
#pragma unroll
    for (int k0 = 0; k0 < kChunk; k0 += 16) {
      const float* p0 = Ss + (mt * 16 + g) * kScoreRow + k0 + 2 * t;
      const float2 q00 = *reinterpret_cast<const float2*>(p0), q01 = *reinterpret_cast<const float2*>(p0 + 8);
      const float2 q10 = *reinterpret_cast<const float2*>(p0 + 8 * kScoreRow);
      const float2 q11 = *reinterpret_cast<const float2*>(p0 + 8 * kScoreRow + 8);
      const __nv_bfloat162 h00 = __floats2bfloat162_rn(q00.x, q00.y), h10 = __floats2bfloat162_rn(q10.x, q10.y);
      const __nv_bfloat162 h01 = __floats2bfloat162_rn(q01.x, q01.y), h11 = __floats2bfloat162_rn(q11.x, q11.y);
      const __nv_bfloat162 l00 = __floats2bfloat162_rn(q00.x - __low2float(h00), q00.y - __high2float(h00));
      const __nv_bfloat162 l10 = __floats2bfloat162_rn(q10.x - __low2float(h10), q10.y - __high2float(h10));
      const __nv_bfloat162 l01 = __floats2bfloat162_rn(q01.x - __low2float(h01), q01.y - __high2float(h01));
      const __nv_bfloat162 l11 = __floats2bfloat162_rn(q11.x - __low2float(h11), q11.y - __high2float(h11));
      // The warp's tiles dt = warp + W·i two at a time (dt and dt + W): one transposed ldmatrix
      // gives both tiles' B fragments (keys k0 … k0 + 15, head dimensions 8·dt …), the same
      // values the mma's took from scalar loads before.
#pragma unroll
      for (int i = 0; i < kMaxTilesPerWarp; i += 2) {
        const int dt = warp + i * W;
        if (dt >= dtiles) break;
        const bool both = dt + W < dtiles;  // warp-uniform
        const int m = lane / 8;
        uint32_t b[4];
        ldmatrix_trans(b, Vs + (k0 + lane % 8 + 8 * (m & 1)) * Dp + (dt + W * (m >> 1)) * 8, both);
        mma_bf16_16x8x16(acc[i], bf16_pair_bits(h00), bf16_pair_bits(h10), bf16_pair_bits(h01), bf16_pair_bits(h11),
                         b[0], b[1]);
        if (!(a.diag & 32))
          mma_bf16_16x8x16(acc[i], bf16_pair_bits(l00), bf16_pair_bits(l10), bf16_pair_bits(l01),
                           bf16_pair_bits(l11), b[0], b[1]);
        if (both) {
          mma_bf16_16x8x16(acc[i + 1], bf16_pair_bits(h00), bf16_pair_bits(h10), bf16_pair_bits(h01),
                           bf16_pair_bits(h11), b[2], b[3]);
          if (!(a.diag & 32))
            mma_bf16_16x8x16(acc[i + 1], bf16_pair_bits(l00), bf16_pair_bits(l10), bf16_pair_bits(l01),
                             bf16_pair_bits(l11), b[2], b[3]);
        }
      }
    }
    if (a.diag & 64) continue;
    // Rows g and g + 8 of the tile; a row whose visible keys end before this chunk writes nothing.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int qv = mt * 16 + g + half * 8;
      if (qv >= nq) continue;
      const int64_t tq = t0 + qv / hg;
      if (keys_in_chunk(visible_keys(tq, a.kv_len, a.q_pos0, a.causal), c0) == 0) continue;
      float* dst = a.part_o + ((tq * a.hq + h_base + qv % hg) * a.nc + c) * a.D;
#pragma unroll
      for (int i = 0; i < kMaxTilesPerWarp; ++i) {
        const int dt = warp + i * W;
        if (dt >= dtiles) break;
        *reinterpret_cast<float2*>(dst + dt * 8 + 2 * t) = make_float2(acc[i][2 * half], acc[i][2 * half + 1]);
      }
    }
  }
}

// Which shared-memory carveout a split launch asks for (kDecodeSplitCarveout, below). The kernel
// is the same code for each; a carveout belongs to a function, so each is an instantiation.
enum SplitCarveout : int { kCarveoutDriver = 0, kCarveoutDecode = 1, kCarveoutBlock = 2 };

// One block per (chunk, KV head, tile of rows × heads of the group); see the file comment.
template <int W, int CARVEOUT = kCarveoutDriver>
__global__ void __launch_bounds__(W * 32) split_kernel(const SplitArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int c = blockIdx.x, kvh = blockIdx.y;
  const int row_tile = blockIdx.z / a.head_tiles, head_tile = blockIdx.z % a.head_tiles;
  const int64_t t0 = int64_t(row_tile) * a.rows_per_block;
  const int rows = static_cast<int>(min(int64_t(a.rows_per_block), a.T - t0));
  const int h_in_group = head_tile * a.heads_per_block;
  const int hg = min(a.heads_per_block, a.group - h_in_group);
  const int h_base = kvh * a.group + h_in_group;  // first query head of the tile
  const int64_t c0 = int64_t(c) * kChunk;
  // Visible counts grow with the row, so the tile's last row bounds what must be loaded; keys
  // past it (rows beyond kv_len among them) are never read.
  const int n_load = keys_in_chunk(visible_keys(t0 + rows - 1, a.kv_len, a.q_pos0, a.causal), c0);
  const TimelineMark mark = grid_dependency_begin();
  if (n_load > 0) {
    if (a.mma) split_chunk_mma<W>(a, smem, c, kvh, t0, rows, hg, h_base, c0, n_load);
    else split_chunk(a, smem, c, kvh, t0, rows, hg, h_base, c0, n_load);
  }
  mark.exit();
}

// The merge, after split_kernel: one warp per (row, head), lane l owning output elements
// l·V … (V = 4 when D % 4 == 0) and, for the max, chunks l, l + 32, …:
// out = Σ_c o_c·2^(m_c − M) / Σ_c l_c·2^(m_c − M), both sums in chunk order 0, 1, … (each chunk's
// weight and sum broadcast from its lane), the max exact in any order. The chunks' outputs are
// loaded before the max is known, so the merge costs about one trip to L2, not one per chunk.
// The partials are read through L2 (__ldcg): each is used once. (Merging in split_kernel, by
// each tile's last block to finish, put a whole tile's merge on one block: the DFlash step at
// Qwen3-8B shapes took 7.35 ms against 6.79 with a separate launch, H200, 2026-11-29; again,
// staged through shared memory with this arithmetic: 7.67 against 6.22-6.25 ms, 2026-11-30;
// for decode rows alone, each KV head's last chunk block merging its four heads with this
// function and releasing its dependents only after its partials: plain decode 221.7-223.1
// against 226.2-227.6 tokens/s, 2026-12-02.)
//
// Long contexts (65 chunks at 4096 cached rows) are summed in batches of kMergeBatch chunks, each
// batch loaded before it is summed: one trip to L2 a batch instead of one a chunk, which made the
// sum a chain of trips (with a load a chunk past the first batch: plain decode 200.4-200.9 against
// 205.0-206.2 tokens/s, a DFlash step 7.444-7.549 against 7.281-7.296 ms at 4096 cached rows, H200,
// 2026-12-02; the same fmaf's in the same order, so the same bits). The first batch is loaded
// before the max is known, so up to kMergeBatch chunks (1024 cached rows) cost one trip in all.
constexpr int kMergeBatch = 16;
template <int V>
__global__ void __launch_bounds__(128) split_merge_kernel(const SplitArgs a) {
  static_assert(32 % kMergeBatch == 0, "a batch must not straddle two windows of 32 chunks");
  grid_dependency_begin(a.dependents_first);  // see kDecodeSplitCarveout
  const int lane = threadIdx.x % 32;
  const int64_t pair = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // t · hq + h
  if (pair >= a.T * a.hq) return;  // whole warps
  const int64_t t = pair / a.hq;
  const int n = static_cast<int>((visible_keys(t, a.kv_len, a.q_pos0, a.causal) + kChunk - 1) / kChunk);
  const float2* ml = a.part_ml + pair * a.nc;
  const float* po = a.part_o + pair * a.nc * int64_t(a.D);
  __nv_bfloat16* out = a.out + t * a.ldo + int64_t(pair % a.hq) * a.D;
  const float2 first = lane < n ? __ldcg(&ml[lane]) : make_float2(-INFINITY, 0.f);
  for (int base = 0; base < a.D; base += 32 * V) {  // warp-uniform
    const int d0 = base + lane * V;
    const bool live = d0 < a.D;  // D % V == 0
    float batch[kMergeBatch][V];
    auto load_batch = [&](int cb) {
#pragma unroll
      for (int i = 0; i < kMergeBatch; ++i)
        if (cb + i < n && live) {
          const float* src = po + int64_t(cb + i) * a.D + d0;
          if constexpr (V == 4) {
            const float4 o = __ldcg(reinterpret_cast<const float4*>(src));
            batch[i][0] = o.x;
            batch[i][1] = o.y;
            batch[i][2] = o.z;
            batch[i][3] = o.w;
          } else {
            batch[i][0] = __ldcg(src);
          }
        }
    };
    load_batch(0);
    float M = first.x;
    for (int c = lane + 32; c < n; c += 32) M = fmaxf(M, __ldcg(&ml[c].x));
    M = warp_max(M);
    float num[V], den = 0.f;
#pragma unroll
    for (int e = 0; e < V; ++e) num[e] = 0.f;
    float2 x = first;  // chunks cb … cb + 31: lane l holds chunk cb + l's (max, sum)
    float w_lane = lane < n ? exp2f(x.x - M) : 0.f;
    for (int cb = 0; cb < n; cb += kMergeBatch) {  // warp-uniform
      if (cb > 0) {
        if (cb % 32 == 0) {
          x = cb + lane < n ? __ldcg(&ml[cb + lane]) : make_float2(-INFINITY, 0.f);
          w_lane = cb + lane < n ? exp2f(x.x - M) : 0.f;
        }
        load_batch(cb);
      }
#pragma unroll
      for (int i = 0; i < kMergeBatch; ++i) {
        const int c = cb + i;
        if (c >= n) break;  // warp-uniform
        const float w = __shfl_sync(0xffffffffu, w_lane, c % 32), l = __shfl_sync(0xffffffffu, x.y, c % 32);
        if (live) {
#pragma unroll
          for (int e = 0; e < V; ++e) num[e] = fmaf(batch[i][e], w, num[e]);
        }
        den = fmaf(l, w, den);
      }
    }
    if (live) {
#pragma unroll
      for (int e = 0; e < V; ++e) out[d0 + e] = __float2bfloat16_rn(n > 0 ? num[e] / den : 0.f);
    }
  }
}

// Split tiles hold about this many queries (rows × heads); see attention().
constexpr int kSplitTileQueries = 16;
constexpr int64_t kSplitManyBlocks = 2048;

// The split kernel's shared-memory carveout, for the product after it. The skinny products keep
// their weight loads in flight through L1, so they run slowly on an SM whose unified L1 / shared
// memory went mostly to shared memory (with the products' own carveout at 100 % plain decode fell
// from 227 to 171 tokens/s, 2026-12-01), and an SM changes its carveout only when it is empty.
// Left to the driver, the split kernel takes a large one (several of its 43 KB blocks an SM),
// and the next products start under PDL on SMs that still hold split blocks. So:
// - a decode step asks for a quarter (64 KB: one block an SM; 80 blocks at 512 cached rows), and
//   its merge then lets o_proj's blocks in before its own wait: they become resident beside the
//   split blocks and start streaming their first weights while attention still runs. Letting
//   them in early with the driver's carveout cost 4 % (218-220 against 228 tokens/s);
// - a verification or drafting block asks for 44 % (100 KB: two blocks an SM).
// Against the driver's carveout with the merge waiting first, alternating in one run (H200,
// 2026-12-02, docs/benchmarks.md twenty-seventh pass, call 4): plain decode 228.5-228.8 against
// 226.9-227.9 tokens/s, a DFlash step 5.973-6.001 against 6.062-6.125 ms. 64 % for blocks, or
// 44 % for decode, was slower (call 3). A launch asks only where its blocks fit in two waves at
// those carveouts (up to about 1000 cached rows at Qwen3-8B shapes; longer contexts were not
// measured): past that it would cost the split kernel waves. The chunks, sums and bits are the
// same either way.
constexpr int kDecodeSplitCarveout = 25;  // percent of the largest shared memory, a hint
constexpr int kBlockSplitCarveout = 44;

// Whether the split path runs on the tensor cores: the kernel must exist as sm_80+ code in this
// binary (an older PTX-only build has the mma compiled to a trap). Read once per process, so a
// row alone and the same row in a block always take the same arithmetic. DFLASH_ATTN_MMA=0
// keeps the CUDA-core path (to measure against).
bool split_mma_enabled() {
  static const bool enabled = [] {
    if (const char* e = std::getenv("DFLASH_ATTN_MMA"); e && std::string(e) == "0") return false;
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, split_kernel<kSplitWarps>) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attr.ptxVersion >= 80 && attr.binaryVersion >= 80;
  }();
  return enabled;
}

int64_t split_chunks(int64_t kv_len) { return (kv_len + kChunk - 1) / kChunk; }
int round_up8(int64_t d) { return static_cast<int>((d + 7) / 8 * 8); }
// Queries (rows × heads) one split block serves: its shared memory holds them in f32.
int split_max_queries(int D8) { return D8 <= 128 ? 64 : 32; }
// Where the (max, sum) pairs end and the outputs begin: 256-byte aligned for the float4 stores.
size_t split_ml_bytes(int64_t T, int64_t hq, int64_t nc) { return (size_t(T * hq * nc) * sizeof(float2) + 255) / 256 * 256; }

}  // namespace

size_t attention_scratch_bytes(int64_t T, int64_t hq, int64_t head_dim, int64_t kv_len) {
  if (T > kAttentionSplitMaxRows || T == 0) return 0;
  const int64_t nc = split_chunks(kv_len);
  return split_ml_bytes(T, hq, nc) + size_t(T * hq * nc * head_dim) * sizeof(float);
}

void attention(const void* q, int64_t ldq, const void* k, int64_t ldk, const void* v, int64_t ldv, void* out,
               int64_t ldo, int64_t T, int64_t hq, int64_t hkv, int64_t head_dim, int64_t kv_len, int64_t q_pos0,
               bool causal, void* scratch, cudaStream_t s) {
  if (head_dim > kMaxHeadDim) throw Error("cuda attention: head_dim " + std::to_string(head_dim) + " > 256");
  if (T * hq == 0) return;
  const float scale_log2 = 1.4426950408889634f / std::sqrt(static_cast<float>(head_dim));
  // 16-byte key loads need head_dim % 8 == 0 and 16-byte aligned rows and bases.
  const bool vec = head_dim % 8 == 0 && rows_aligned16(k, ldk, 2) && rows_aligned16(v, ldv, 2);
  const auto* qp = static_cast<const __nv_bfloat16*>(q);
  const auto* kp = static_cast<const __nv_bfloat16*>(k);
  const auto* vp = static_cast<const __nv_bfloat16*>(v);
  auto* op = static_cast<__nv_bfloat16*>(out);
  const int group = static_cast<int>(hq / hkv), D = static_cast<int>(head_dim);
  const AttentionOperands operands{qp, kp, vp, ldq, ldk, ldv, op, ldo, T, kv_len, q_pos0, group, scale_log2, causal};

  if (T <= kAttentionSplitMaxRows) {
    if (!scratch && attention_scratch_bytes(T, hq, head_dim, kv_len) > 0)
      throw Error("cuda attention: the split path needs scratch (attention_scratch_bytes)");
    const int64_t nc = split_chunks(kv_len);
    if (nc > INT32_MAX) throw Error("cuda attention: kv_len " + std::to_string(kv_len) + " too long");
    SplitArgs a{};
    bool decode_split = false;  // the decode carveout's launch ran (kDecodeSplitCarveout)
    static_cast<AttentionOperands&>(a) = operands;
    a.part_ml = static_cast<float2*>(scratch);
    a.part_o = reinterpret_cast<float*>(static_cast<char*>(scratch) + split_ml_bytes(T, hq, nc));
    a.hq = static_cast<int>(hq);
    a.D = D;
    a.D8 = round_up8(D);
    a.nc = static_cast<int>(nc);
    a.vec = vec;
    a.qvec = D % 8 == 0 && rows_aligned16(q, ldq, 2);
    a.mma = vec && D % 16 == 0 && split_mma_enabled();
    static const int diag = [] {
      const char* e = std::getenv("DFLASH_ATTN_DIAG");
      return e ? std::atoi(e) : 0;
    }();
    a.diag = diag;
    if (nc > 0) {
      // Tiling decides only which block computes a (row, head, chunk), never how (see the file
      // comment), so it may follow the shape freely. All heads of a group share a block (they
      // share its K/V), then rows: few per block, since more blocks shorten the critical path
      // (H200, 16-row verification at Qwen3-8B shapes, 2026-11-29: 16 queries a tile gave the
      // fastest DFlash step; on CUDA cores 4, 8 and 32 were 2-10 % slower and 64 32 % slower,
      // on the tensor cores 32 and 64 8 % and 18 % slower); the other row tiles re-read the
      // chunk from L2. Only when that makes more than
      // kSplitManyBlocks blocks (long contexts) do the tiles grow again, to save those re-reads.
      const int max_q = split_max_queries(a.D8);
      // Measuring only: DFLASH_ATTN_HEADS_PER_BLOCK=n serves n heads of a group a block (its
      // other heads in other blocks, which stage the chunk again), to tell what a block's count
      // of queries costs apart from what more blocks an SM and more stagings of a chunk cost.
      static const int heads_per_block = [] {
        const char* e = std::getenv("DFLASH_ATTN_HEADS_PER_BLOCK");
        return e && std::atoi(e) > 0 ? std::atoi(e) : 0;
      }();
      a.heads_per_block = std::min({group, max_q, heads_per_block > 0 ? heads_per_block : group});
      a.head_tiles = (group + a.heads_per_block - 1) / a.heads_per_block;
      const int64_t max_rows = std::min<int64_t>(T, std::max(1, max_q / a.heads_per_block));
      static const int tile_queries = [] {
        const char* e = std::getenv("DFLASH_ATTN_TILE_QUERIES");  // measuring only
        return e && std::atoi(e) > 0 ? std::atoi(e) : kSplitTileQueries;
      }();
      int64_t rows = std::min<int64_t>(max_rows, std::max(1, tile_queries / a.heads_per_block));
      const int64_t per_row_tile = nc * hkv * a.head_tiles;
      while (rows < max_rows && per_row_tile * ((T + rows - 1) / rows) > kSplitManyBlocks)
        rows = std::min(max_rows, rows * 2);
      a.rows_per_block = static_cast<int>(rows);
      const int64_t row_tiles = (T + rows - 1) / rows;
      const int nq = a.rows_per_block * a.heads_per_block;
      const size_t smem = a.mma ? split_mma_smem_bytes(a.D8, nq) : split_smem_bytes(a.D8, (nq + 3) / 4 * 4);
      // Above 48 KiB a kernel must opt in; the largest tile (D = 256) fits any sm_90 part.
      static const int warps = [] {
        const char* e = std::getenv("DFLASH_ATTN_WARPS");  // measuring only
        const int w = e ? std::atoi(e) : 0;
        return w == 4 ? w : kSplitWarps;
      }();
      static const int64_t sms = sm_count("attention");
      const int64_t blocks = nc * hkv * row_tiles * a.head_tiles;
      const SplitCarveout carveout = warps != 8 ? kCarveoutDriver
                                     : T == 1   ? (blocks <= sms ? kCarveoutDecode : kCarveoutDriver)
                                                : (blocks <= 4 * sms ? kCarveoutBlock : kCarveoutDriver);
      decode_split = carveout == kCarveoutDecode;
      auto* kernel = carveout == kCarveoutDecode ? split_kernel<8, kCarveoutDecode>
                     : carveout == kCarveoutBlock ? split_kernel<8, kCarveoutBlock>
                     : warps == 4                 ? split_kernel<4>
                                                  : split_kernel<8>;
      // launch.cuh's names for the measuring knobs (DFLASH_CUDA_CARVEOUT overrides these).
      const char* op = carveout == kCarveoutDecode ? "attention_decode"
                       : carveout == kCarveoutBlock ? "attention_block"
                                                    : "attention";
      if (carveout == kCarveoutDecode) default_carveout<split_kernel<8, kCarveoutDecode>>(kDecodeSplitCarveout, op);
      if (carveout == kCarveoutBlock) default_carveout<split_kernel<8, kCarveoutBlock>>(kBlockSplitCarveout, op);
      static const cudaError_t opt_in = [] {
        const int smem_max = static_cast<int>(std::max({split_smem_bytes(128, 64), split_smem_bytes(kMaxHeadDim, 32),
                                                        split_mma_smem_bytes(128, 64),
                                                        split_mma_smem_bytes(kMaxHeadDim, 32)}));
        for (auto* k :
             {split_kernel<4>, split_kernel<8>, split_kernel<8, kCarveoutDecode>, split_kernel<8, kCarveoutBlock>})
          if (const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max))
            return e;
        return cudaSuccess;
      }();
      check(opt_in, "attention", "cudaFuncSetAttribute (dynamic shared memory)");
      const dim3 grid(static_cast<unsigned>(nc), static_cast<unsigned>(hkv),
                      static_cast<unsigned>(row_tiles * a.head_tiles));
      launch_kernel(op, kernel, grid, warps * 32, smem, s, a);
    }
    // Measuring only: DFLASH_ATTN_MERGE_DEPENDENTS_FIRST=R lets dependents in first up to R rows
    // whatever the split kernel's carveout (0: never).
    static const int64_t dependents_first_rows = [] {
      const char* e = std::getenv("DFLASH_ATTN_MERGE_DEPENDENTS_FIRST");
      return e ? std::atoll(e) : int64_t(-1);
    }();
    a.dependents_first = dependents_first_rows >= 0 ? T <= dependents_first_rows : decode_split;
    auto* merge = D % 4 == 0 ? split_merge_kernel<4> : split_merge_kernel<1>;
    launch_kernel("attention_merge", merge, blocks_for(T * hq * 32, 128), 128, 0, s, a);
    return;
  }
  prefill_attention(operands, hq, hkv, D, vec, s);
}

}  // namespace dflash::cuda
