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
// - Larger T (prefill): one block of kWarps warps per (query row, head), below.
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

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/attention_split.cuh"
#include "backend/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

using namespace split_kv;

constexpr int kWarps = 4;

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

// Prefill (T > kAttentionSplitMaxRows): one block of kWarps warps per (query row, head). Keys are
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


// One block per (chunk, KV head, tile of rows × heads of the group).
template <int W>
__global__ void __launch_bounds__(W * 32) split_kernel(const SplitArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  split_block<W>(a, smem, blockIdx.x, blockIdx.y, blockIdx.z, [] { grid_dependency_begin(); });
}

// The merge, after split_kernel: one warp per (row, head), see merge_pair.
template <int V>
__global__ void __launch_bounds__(128) split_merge_kernel(const SplitArgs a) {
  grid_dependency_begin();
  const int64_t pair = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // t · hq + h
  if (pair < a.T * a.hq) merge_pair<V>(a, pair);  // whole warps
}

// Split tiles hold about this many queries (rows × heads); see attention().
constexpr int kSplitTileQueries = 16;
constexpr int64_t kSplitManyBlocks = 2048;

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

namespace split_kv {

SplitPlan plan_split(const void* q, int64_t ldq, const void* k, int64_t ldk, const void* v, int64_t ldv, void* out,
                     int64_t ldo, int64_t T, int64_t hq, int64_t hkv, int64_t head_dim, int64_t kv_len, int64_t q_pos0,
                     bool causal, void* scratch) {
  const int64_t nc = split_chunks(kv_len);
  if (nc > INT32_MAX) throw Error("cuda attention: kv_len " + std::to_string(kv_len) + " too long");
  const int D = static_cast<int>(head_dim);
  SplitPlan p;
  SplitArgs& a = p.a;
  a.q = static_cast<const __nv_bfloat16*>(q);
  a.k = static_cast<const __nv_bfloat16*>(k);
  a.v = static_cast<const __nv_bfloat16*>(v);
  a.ldq = ldq;
  a.ldk = ldk;
  a.ldv = ldv;
  a.part_ml = static_cast<float2*>(scratch);
  a.part_o = reinterpret_cast<float*>(static_cast<char*>(scratch) + split_ml_bytes(T, hq, nc));
  a.out = static_cast<__nv_bfloat16*>(out);
  a.ldo = ldo;
  a.kv_len = kv_len;
  a.q_pos0 = q_pos0;
  a.T = T;
  a.hq = static_cast<int>(hq);
  a.group = static_cast<int>(hq / hkv);
  a.D = D;
  a.D8 = round_up8(D);
  a.nc = static_cast<int>(nc);
  a.scale_log2 = 1.4426950408889634f / std::sqrt(static_cast<float>(head_dim));
  a.causal = causal;
  // 16-byte key loads need head_dim % 8 == 0 and 16-byte aligned rows and bases.
  a.vec = head_dim % 8 == 0 && rows_aligned16(k, ldk, 2) && rows_aligned16(v, ldv, 2);
  a.qvec = D % 8 == 0 && rows_aligned16(q, ldq, 2);
  a.mma = a.vec && D % 16 == 0 && split_mma_enabled();
  static const int diag = [] {
    const char* e = std::getenv("DFLASH_ATTN_DIAG");
    return e ? std::atoi(e) : 0;
  }();
  a.diag = diag;
  p.merge_v = D % 4 == 0 ? 4 : 1;
  static const int warps = [] {
    const char* e = std::getenv("DFLASH_ATTN_WARPS");  // measuring only
    const int w = e ? std::atoi(e) : 0;
    return w == 4 ? w : kSplitWarps;
  }();
  p.warps = warps;
  if (nc == 0) return p;
  // Tiling decides only which block computes a (row, head, chunk), never how (see the file
  // comment), so it may follow the shape freely. All heads of a group share a block (they
  // share its K/V), then rows: few per block, since more blocks shorten the critical path
  // (H200, 16-row verification at Qwen3-8B shapes, 2026-11-29: 16 queries a tile gave the
  // fastest DFlash step; on CUDA cores 4, 8 and 32 were 2-10 % slower and 64 32 % slower,
  // on the tensor cores 32 and 64 8 % and 18 % slower); the other row tiles re-read the
  // chunk from L2. Only when that makes more than
  // kSplitManyBlocks blocks (long contexts) do the tiles grow again, to save those re-reads.
  const int max_q = split_max_queries(a.D8);
  a.heads_per_block = std::min(a.group, max_q);
  a.head_tiles = (a.group + a.heads_per_block - 1) / a.heads_per_block;
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
  p.smem = a.mma ? split_mma_smem_bytes(a.D8, nq) : split_smem_bytes(a.D8, (nq + 3) / 4 * 4);
  p.grid = dim3(static_cast<unsigned>(nc), static_cast<unsigned>(hkv), static_cast<unsigned>(row_tiles * a.head_tiles));
  return p;
}

size_t split_smem_max() {
  return std::max({split_smem_bytes(128, 64), split_smem_bytes(kMaxHeadDim, 32), split_mma_smem_bytes(128, 64),
                   split_mma_smem_bytes(kMaxHeadDim, 32)});
}

}  // namespace split_kv

void attention(const void* q, int64_t ldq, const void* k, int64_t ldk, const void* v, int64_t ldv, void* out,
               int64_t ldo, int64_t T, int64_t hq, int64_t hkv, int64_t head_dim, int64_t kv_len, int64_t q_pos0,
               bool causal, void* scratch, cudaStream_t s) {
  if (head_dim > kMaxHeadDim) throw Error("cuda attention: head_dim " + std::to_string(head_dim) + " > 256");
  if (T * hq == 0) return;
  if (T <= kAttentionSplitMaxRows) {
    if (!scratch && attention_scratch_bytes(T, hq, head_dim, kv_len) > 0)
      throw Error("cuda attention: the split path needs scratch (attention_scratch_bytes)");
    const SplitPlan p = plan_split(q, ldq, k, ldk, v, ldv, out, ldo, T, hq, hkv, head_dim, kv_len, q_pos0, causal,
                                   scratch);
    if (p.a.nc > 0) {
      auto* kernel = p.warps == 4 ? split_kernel<4> : split_kernel<8>;
      // Above 48 KiB a kernel must opt in to its dynamic shared memory; the largest tile (D =
      // 256) fits any sm_90 part.
      static const cudaError_t opt_in = [] {
        for (auto* k : {split_kernel<4>, split_kernel<8>})
          if (const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                         static_cast<int>(split_smem_max())))
            return e;
        return cudaSuccess;
      }();
      check(opt_in, "attention", "cudaFuncSetAttribute (dynamic shared memory)");
      launch_kernel("attention", kernel, p.grid, p.warps * 32, p.smem, s, p.a);
    }
    launch_kernel("attention_merge", p.merge_v == 4 ? split_merge_kernel<4> : split_merge_kernel<1>,
                  blocks_for(T * hq * 32, 128), 128, 0, s, p.a);
    return;
  }

  const float scale_log2 = 1.4426950408889634f / std::sqrt(static_cast<float>(head_dim));
  // 16-byte key loads need head_dim % 8 == 0 and 16-byte aligned rows and bases.
  const bool vec = head_dim % 8 == 0 && rows_aligned16(k, ldk, 2) && rows_aligned16(v, ldv, 2);
  const auto* qp = static_cast<const __nv_bfloat16*>(q);
  const auto* kp = static_cast<const __nv_bfloat16*>(k);
  const auto* vp = static_cast<const __nv_bfloat16*>(v);
  auto* op = static_cast<__nv_bfloat16*>(out);
  const int group = static_cast<int>(hq / hkv), D = static_cast<int>(head_dim);

  const unsigned blocks = static_cast<unsigned>(T * hq);
  auto launch = [&](auto kernel) {
    launch_kernel("attention", kernel, blocks, kWarps * 32, 0, s, qp, ldq, kp, ldk, vp, ldv, op, ldo,
                  static_cast<int>(hq), group, D, kv_len, q_pos0, causal, scale_log2, vec);
  };
  if (head_dim <= 32) launch(attention_kernel<1>);
  else if (head_dim <= 64) launch(attention_kernel<2>);
  else if (head_dim <= 128) launch(attention_kernel<4>);
  else launch(attention_kernel<8>);
}

}  // namespace dflash::cuda
