// How fast this device streams memory into the SMs: the yardstick for the matrix products of a
// decode step, which read each weight once and write almost nothing. (copy_bandwidth, beside
// it in cuda_backend.cc, is the issue's roofline: a device-to-device copy.)
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/bulk_ring.cuh"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "util/dtype.h"

namespace dflash::cuda {
namespace {

// Flavours of the 16-byte load, to compare (read_bandwidth's `flavour`): 0 the products'
// ld_stream_16 (read-only, no L1 allocation, 256-byte L2 prefetch); 1 the same without the
// prefetch hint; 2 a plain read-only load (__ldg); 3 flavour 0 with an evict-first L2 policy.
template <int F>
__device__ __forceinline__ uint4 load16(const void* p, uint64_t policy) {
  if constexpr (F == 0) {
    return ld_stream_16(p);
  } else if constexpr (F == 1) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
  } else if constexpr (F == 2) {
    return __ldg(static_cast<const uint4*>(p));
  } else {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(policy));
    return v;
  }
}

__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// Every 16-byte unit of p[0, n) read once, four loads in flight per thread; the xor of what was
// read goes to `sink` only in the never-taken case, so the loads stay.
template <int F, int UNROLL>
__global__ void __launch_bounds__(256) read_kernel(const uint4* __restrict__ p, int64_t n, unsigned* sink) {
  const uint64_t policy = F == 3 ? evict_first_policy() : 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) v[u] = load16<F>(p + i + u * stride, policy);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = load16<F>(p + i, policy);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// The skinny product's access pattern without its arithmetic (skinny_matmul.cu): a warp owns
// R (8 or 16) rows of a [N, K] bf16 matrix and a K slice of 1/S; lane (g, t) reads 16 bytes of
// rows g (and g + 8) at unit t + 4c of chunk c, U chunks a batch, the next batch issued before
// the current one is used. What streaming a weight this way can reach, beside read_kernel's.
// PAIR (R = 16): the gate/up product's pattern, a warp's two groups of 8 rows N / 2 rows apart
// (gate rows n … n + 7 and up rows N / 2 + n …) instead of 16 neighbours.
template <int R, int U, int F = 0, bool PAIR = false>
__global__ void __launch_bounds__(256, 2) rows_kernel(const char* __restrict__ w, int N, int K, int S,
                                                      unsigned* sink) {
  constexpr int H = R / 8;
  const uint64_t policy = F == 3 ? evict_first_policy() : 0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int G = 8 / S, group = warp % G, slice = warp / G;
  const int64_t n0 = (int64_t(blockIdx.x) * G + group) * (PAIR ? 8 : R);
  if (n0 >= (PAIR ? N / 2 : N)) return;
  const int chunks = K / 32, c_begin = slice * chunks / S, c_end = (slice + 1) * chunks / S;
  const uint4* row[H];
#pragma unroll
  for (int h = 0; h < H; ++h)
    row[h] = reinterpret_cast<const uint4*>(w + (n0 + (PAIR ? h * int64_t(N / 2) : 8 * h) + g) * int64_t(K) * 2) + t;
  uint4 cur[U][H], next[U][H];
  auto load = [&](uint4 (&d)[U][H], int c) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cu = min(c + u, c_end - 1);
#pragma unroll
      for (int h = 0; h < H; ++h) d[u][h] = load16<F>(row[h] + 4 * cu, policy);
    }
  };
  uint32_t acc = 0;
  load(cur, c_begin);
  for (int c = c_begin; c < c_end; c += U) {
    if (c + U < c_end) load(next, c + U);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int h = 0; h < H; ++h) acc ^= cur[u][h].x ^ cur[u][h].y ^ cur[u][h].z ^ cur[u][h].w;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int h = 0; h < H; ++h) cur[u][h] = next[u][h];
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

__device__ __forceinline__ void cp_async16_cg(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

// The same weight streamed through shared memory: a warp owns 16 rows and a K slice; each
// stage copies U chunks of its 16 rows with cp.async, each instruction covering whole
// 64·U-byte row segments (coalesced), STAGES stages in flight; the lanes then read their
// 16-byte pieces back as the tensor-core fragments would be read. 4 warps a block.
template <int U, int STAGES>
__global__ void __launch_bounds__(128) rows_smem_kernel(const char* __restrict__ w, int N, int K, int S,
                                                        unsigned* sink) {
  constexpr int kRowBytes = 64 * U, kPad = 16, kStride = kRowBytes + kPad, kStage = 16 * kStride;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int G = 4 / S, group = warp % G, slice = warp / G;
  unsigned char* buf = smem_raw + warp * STAGES * kStage;
  const int64_t n0 = (int64_t(blockIdx.x) * G + group) * 16;
  if (n0 >= N) return;
  const int chunks = K / 32, c_begin = slice * chunks / S, c_end = (slice + 1) * chunks / S;
  const char* base = w + n0 * int64_t(K) * 2;
  constexpr int kUnitsPerRow = kRowBytes / 16;
  auto issue = [&](int c, int stage) {
    unsigned char* dst = buf + stage * kStage;
    for (int i = lane; i < 16 * kUnitsPerRow; i += 32) {
      const int r = i / kUnitsPerRow, u = i % kUnitsPerRow;
      const int64_t off = int64_t(r) * K * 2 + int64_t(c) * 64 + u * 16;
      const bool in = c * 64 + u * 16 < c_end * 64;  // past the slice: re-read its start
      cp_async16_cg(dst + r * kStride + u * 16, base + (in ? off : int64_t(r) * K * 2 + int64_t(c_begin) * 64));
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };
  uint32_t acc = 0;
  int issued = c_begin;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    issue(issued, s);
    issued += U;
  }
  int stage = 0;
  for (int c = c_begin; c < c_end; c += U) {
    issue(issued, (stage + STAGES - 1) % STAGES);
    issued += U;
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 1) : "memory");
    __syncwarp();
    const unsigned char* src = buf + stage * kStage;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 v = *reinterpret_cast<const uint4*>(src + (8 * h + g) * kStride + (4 * u + t) * 16);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
    __syncwarp();
    stage = (stage + 1) % STAGES;
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  if (acc == 0x9e3779b9u) *sink = acc;
}


// Flavours 4-6: the tensor memory accelerator's 1-D bulk copy (cp.async.bulk) into a ring of
// STAGES shared-memory tiles, each with an mbarrier that the copy completes; one thread issues,
// the block reads each landed tile from shared memory, and the tile is refilled once every
// thread is past it. A few instructions keep a whole tile in flight, where 16-byte loads need
// a register each.
// Copy j of a ring of STAGES stages of TILE bytes, read by the block once it has landed (its
// words XORed into acc, so that the loads cannot be left out); the stage is free again after
// the barrier at the end.
template <int TILE, int STAGES>
__device__ __forceinline__ void ring_take(const unsigned char* ring, uint64_t* landed, int64_t j, uint32_t& acc) {
  const int s = int(j % STAGES);
  ring_wait(&landed[s], uint32_t(j / STAGES) & 1u);
  const uint4* t = reinterpret_cast<const uint4*>(ring + s * TILE);
#pragma unroll 4
  for (int i = threadIdx.x; i < TILE / 16; i += 256) {
    const uint4 v = t[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  __syncthreads();
}

template <int TILE, int STAGES>
__global__ void __launch_bounds__(256) bulk_read_kernel(const char* __restrict__ p, int64_t tiles, unsigned* sink) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) uint64_t landed[STAGES];
  const int64_t mine = (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x;  // tiles blockIdx.x + j·gridDim.x
  ring_init(landed);
  auto issue = [&](int64_t j) {
    const int s = int(j % STAGES);
    ring_issue(ring + s * TILE, &landed[s], p + (blockIdx.x + j * gridDim.x) * int64_t(TILE), TILE);
  };
  if (threadIdx.x == 0)
    for (int64_t j = 0; j < STAGES && j < mine; ++j) issue(j);
  uint32_t acc = 0;
  for (int64_t j = 0; j < mine; ++j) {
    ring_take<TILE, STAGES>(ring, landed, j, acc);
    if (threadIdx.x == 0 && j + STAGES < mine) issue(j + STAGES);
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// What a release costs a block that streams a weight (release_probe). Tiles of kReleaseTile
// bytes, as large as a gate/up product's tile, block b taking tiles b, b + gridDim.x, …; after
// each tile, a barrier, then thread 0 raises a counter (the handing-over of a tile's results to
// another block), with RELEASE a `fence.acq_rel.gpu` first. Two ways of streaming. With 16-byte
// loads (tiled_read_kernel) the next tile's first batch is already in flight at the barrier, as
// in the skinny products. With bulk copies (tiled_bulk_kernel) thread 0 keeps the ring full.
constexpr int kReleaseTile = 256 << 10;

__device__ __forceinline__ void raise_counter(unsigned* counter, bool release) {
  if (release) asm volatile("fence.acq_rel.gpu;" ::: "memory");
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
}

// ROWS: each tile read as the gate/up product reads a tile of its weight (32 rows of 4096 bf16,
// warp = K slice · 2 + group of 16 rows, lane (g, t) 16 bytes of rows g and g + 8 at unit 4c + t
// of chunk c), instead of in contiguous 512-byte warp segments: what that pattern costs.
template <bool RELEASE, bool ROWS = false>
__global__ void __launch_bounds__(256, 2) tiled_read_kernel(const uint4* __restrict__ p, int64_t tiles,
                                                            unsigned* counter, unsigned* sink) {
  constexpr int kUnits = kReleaseTile / 16, kPerLane = kUnits / 256, U = 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t mine = (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x;
  // Contiguous: lane l of warp w reads units w·kUnits/8 + 32j + l of its tile. Rows: load j is
  // chunk j / 2 of the warp's slice, n8 tile j % 2.
  auto unit = [&](int64_t j_tile, int j) {
    const uint4* tile = p + (blockIdx.x + j_tile * gridDim.x) * int64_t(kUnits);
    if constexpr (ROWS) {
      constexpr int kRowUnits = 4096 * 2 / 16;
      const int slice = warp / 2, group = warp % 2, g = lane / 4, t = lane % 4;
      const int row = group * 16 + (j % 2) * 8 + g, c = slice * 32 + j / 2;
      return tile + row * kRowUnits + 4 * c + t;
    } else {
      return tile + warp * (kUnits / 8) + j * 32 + lane;
    }
  };
  uint4 cur[U], next[U];
  uint32_t acc = 0;
  if (mine > 0)
#pragma unroll
    for (int u = 0; u < U; ++u) cur[u] = ld_stream_16(unit(0, u));
  for (int64_t t = 0; t < mine; ++t) {
    for (int j0 = 0; j0 < kPerLane; j0 += U) {
      if (j0 + U < kPerLane) {
#pragma unroll
        for (int u = 0; u < U; ++u) next[u] = ld_stream_16(unit(t, j0 + U + u));
      } else if (t + 1 < mine) {
#pragma unroll
        for (int u = 0; u < U; ++u) next[u] = ld_stream_16(unit(t + 1, u));
      }
#pragma unroll
      for (int u = 0; u < U; ++u) acc ^= cur[u].x ^ cur[u].y ^ cur[u].z ^ cur[u].w;
#pragma unroll
      for (int u = 0; u < U; ++u) cur[u] = next[u];
    }
    __syncthreads();
    if (threadIdx.x == 0) raise_counter(counter, RELEASE);
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// bulk_read_kernel's ring (16 KiB tiles, 4 stages) with the counter raised every kReleaseTile
// bytes, right after thread 0 has refilled the ring: three copies are in flight then.
template <bool RELEASE>
__global__ void __launch_bounds__(256) tiled_bulk_kernel(const char* __restrict__ p, int64_t tiles, unsigned* counter,
                                                         unsigned* sink) {
  constexpr int TILE = 16 << 10, STAGES = 4, kPerRelease = kReleaseTile / TILE;
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) uint64_t landed[STAGES];
  const int64_t mine = (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x;
  ring_init(landed);
  // Consecutive tiles of a block are contiguous here (kPerRelease of them make one release tile).
  auto issue = [&](int64_t j) {
    const int s = int(j % STAGES);
    const int64_t big = j / kPerRelease, piece = j % kPerRelease;
    ring_issue(ring + s * TILE, &landed[s], p + (blockIdx.x + big * gridDim.x) * int64_t(kReleaseTile) + piece * TILE,
               TILE);
  };
  const int64_t pieces = mine * kPerRelease;
  if (threadIdx.x == 0)
    for (int64_t j = 0; j < STAGES && j < pieces; ++j) issue(j);
  uint32_t acc = 0;
  for (int64_t j = 0; j < pieces; ++j) {
    ring_take<TILE, STAGES>(ring, landed, j, acc);
    if (threadIdx.x == 0) {
      if (j + STAGES < pieces) issue(j + STAGES);
      if ((j + 1) % kPerRelease == 0) raise_counter(counter, RELEASE);
    }
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// Bytes read per second by `launches_of_one_rep` (queued back to back, reading `bytes` of a
// buffer of that size filled with a byte pattern): the best of three timed repetitions after a
// warm-up one. The launcher gets the buffer and a sink word for the kernels' never-taken store.
double best_read_rate(size_t bytes, const std::function<void(const char*, unsigned*)>& launches_of_one_rep) {
  const DeviceBuffer buf(bytes, "bandwidth"), sink(sizeof(unsigned), "bandwidth");
  check(cudaMemset(buf.as(), 0x5a, bytes), "bandwidth", "cudaMemset");
  return best_timed_rate(4, double(bytes), [&](int) {
    launches_of_one_rep(buf.as<const char>(), sink.as<unsigned>());
    check(cudaGetLastError(), "bandwidth", "kernel launch");
  });
}

// What a prefetch into L2 leaves for a later read (l2_stage_probe): the bulk prefetch the
// products stage weights with (16 KB pieces, one warp a block), a per-line prefetch, and a
// spin that holds the stream while the prefetches land.
__global__ void bulk_prefetch_kernel(const char* p, int64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x >= 32) return;
  constexpr int64_t kPiece = 16384;
  const int64_t share = (bytes / 16 + gridDim.x - 1) / gridDim.x * 16;
  const int64_t begin = int64_t(blockIdx.x) * share, end = min(begin + share, bytes);
  for (int64_t at = begin + int64_t(threadIdx.x) * kPiece; at < end; at += 32 * kPiece)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + at), "r"(unsigned(min(kPiece, end - at)))
                 : "memory");
#endif
}
__global__ void line_prefetch_kernel(const char* p, int64_t bytes) {
  for (int64_t at = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 128; at < bytes;
       at += int64_t(gridDim.x) * blockDim.x * 128)
    asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p + at));
}
__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}


// A skinny product fed by bulk copies (bulk_product_probe), beside the backend's 16-byte-load
// kernel (skinny_matmul.cu): y[M, N] = x[M, K] · w[N, K]ᵀ for M ≤ 16, bf16 in, f32 out, w
// row-major as uploaded. A tile is 16 rows of w over all of K; a stage is SK columns of the
// tile's rows, one bulk copy a row into a padded row of the ring, so that the lanes' 16-byte
// fragment reads are free of bank conflicts. Block b takes tiles b, b + grid, … and keeps the
// ring's ST stages in flight across its tiles; its 8 warps take SK / 256 of a stage's chunks
// of 32 columns each, as m16n8k16 mma's with the fragment layout skinny_matmul.cu
// uses, and meet in shared memory at a tile's end (warps added in order: the same sums for
// every M). What the design that would let products hand tiles to each other without a
// release waiting on the weight stream (docs/cuda.md, What remains, item 0) reads at, measured
// on the products' own shapes before anything is built on it.
template <int SK, int ST, bool LANES>
__global__ void __launch_bounds__(256, 2) bulk_product_kernel(const __nv_bfloat16* __restrict__ x,
                                                              const __nv_bfloat16* __restrict__ w,
                                                              float* __restrict__ y, int M, int N, int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kPitch = bulk_row_pitch<SK>(), kStageBytes = kBulkRows * kPitch;
  constexpr int kWarpChunks = SK / 32 / 8;  // chunks of 32 columns a warp takes of each stage
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) uint64_t landed[ST];
  __shared__ float part[8][16][16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int per_tile = K / SK;
  const int64_t tiles = N / kBulkRows;
  const int64_t mine = (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x;
  const int64_t copies = mine * per_tile;
  ring_init(landed);
  // Stage j % per_tile of the block's tile j / per_tile, into ring stage j % ST: by thread 0,
  // or (LANES) by lanes 0-15 of warp 0, after lane 0 has set the bytes to expect.
  auto issue = [&](int64_t j) {
    const int s = int(j % ST);
    const int64_t row0 = (blockIdx.x + (j / per_tile) * gridDim.x) * kBulkRows;
    const int64_t k0 = (j % per_tile) * SK;
    unsigned char* stage = ring + s * kStageBytes;
    if (lane == 0) ring_expect(&landed[s], kBulkRows * SK * 2);
    auto copy_row = [&](int r) { ring_copy(stage + r * kPitch, &landed[s], w + (row0 + r) * K + k0, SK * 2); };
    if constexpr (LANES) {
      __syncwarp();
      if (lane < kBulkRows) {
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        copy_row(lane);
      }
    } else if (lane == 0) {
      for (int r = 0; r < kBulkRows; ++r) copy_row(r);
    }
  };
  const bool issuer = LANES ? warp == 0 : threadIdx.x == 0;
  if (issuer)
    for (int64_t j = 0; j < ST && j < copies; ++j) issue(j);
  // x's rows g and g + 8 (zeros past M), 16-byte unit t of each chunk.
  const uint4* xrow0 = reinterpret_cast<const uint4*>(x + int64_t(g < M ? g : 0) * K) + t;
  const uint4* xrow1 = reinterpret_cast<const uint4*>(x + int64_t(g + 8 < M ? g + 8 : 0) * K) + t;
  const bool in0 = g < M, in1 = g + 8 < M;
  float acc[2][4] = {};
  for (int64_t j = 0; j < copies; ++j) {
    const int s = int(j % ST), ks = int(j % per_tile);
    uint4 a[kWarpChunks][2];  // x for the warp's chunks, loaded before the wait
#pragma unroll
    for (int cc = 0; cc < kWarpChunks; ++cc) {
      const int unit = ks * (SK / 8) + 4 * (kWarpChunks * warp + cc);
      a[cc][0] = in0 ? __ldg(xrow0 + unit) : make_uint4(0, 0, 0, 0);
      a[cc][1] = in1 ? __ldg(xrow1 + unit) : make_uint4(0, 0, 0, 0);
    }
    ring_wait(&landed[s], uint32_t(j / ST) & 1u);
    const unsigned char* stage = ring + s * kStageBytes;
    bulk_stage_mma<SK>(stage, a, acc, warp, g, t);
    __syncthreads();  // every warp is past stage s: it may be refilled
    if (issuer && j + ST < copies) issue(j + ST);
    if (ks == per_tile - 1) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          part[warp][g + (i / 2) * 8][nt * 8 + 2 * t + i % 2] = acc[nt][i];
          acc[nt][i] = 0.f;
        }
      __syncthreads();
      const int64_t row0 = (blockIdx.x + (j / per_tile) * gridDim.x) * kBulkRows;
      for (int i = threadIdx.x; i < M * kBulkRows; i += 256) {
        const int m = i / kBulkRows, col = i % kBulkRows;
        float sum = part[0][m][col];
        for (int v = 1; v < 8; ++v) sum += part[v][m][col];
        y[int64_t(m) * N + row0 + col] = sum;
      }
      __syncthreads();  // part is written again at the next tile's end
    }
  }
#else
  (void)x, (void)w, (void)y, (void)M, (void)N, (void)K;
  __trap();
#endif
}

}  // namespace

double l2_stage_probe(size_t bytes, int mode) {
  bytes = std::max<size_t>(bytes / 16 * 16, 16);
  constexpr size_t kFlush = size_t(256) << 20;
  const int sms = sm_count("bandwidth");
  const DeviceBuffer buf(bytes, "bandwidth"), flush_buf(kFlush, "bandwidth"), sink_buf(sizeof(unsigned), "bandwidth");
  check(cudaMemset(buf.as(), 0x5a, bytes), "bandwidth", "cudaMemset");
  check(cudaMemset(flush_buf.as(), 0x3c, kFlush), "bandwidth", "cudaMemset");
  const Event e0("bandwidth"), e1("bandwidth");
  const auto* p = buf.as<const char>();
  const auto* flush = flush_buf.as<const uint4>();
  unsigned* const sink = sink_buf.as<unsigned>();
  const unsigned blocks = unsigned(sms * 8);
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    read_kernel<0, 4><<<blocks, 256>>>(flush, int64_t(kFlush / 16), sink);
    if (mode == 1 || mode == 4) bulk_prefetch_kernel<<<unsigned(sms * 2), 256>>>(p, int64_t(bytes));
    if (mode == 2) line_prefetch_kernel<<<unsigned(sms * 2), 256>>>(p, int64_t(bytes));
    if (mode == 3) read_kernel<0, 4><<<blocks, 256>>>(reinterpret_cast<const uint4*>(p), int64_t(bytes / 16), sink);
    if (mode != 4) spin_kernel<<<1, 32>>>(100000);  // ≈ 50 µs: every prefetch has landed
    check(cudaEventRecord(e0), "bandwidth", "cudaEventRecord");
    read_kernel<0, 4><<<blocks, 256>>>(reinterpret_cast<const uint4*>(p), int64_t(bytes / 16), sink);
    check(cudaEventRecord(e1), "bandwidth", "cudaEventRecord");
    check(cudaEventSynchronize(e1), "bandwidth", "cudaEventSynchronize");
    check(cudaGetLastError(), "bandwidth", "kernel launch");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0, e1), "bandwidth", "cudaEventElapsedTime");
    if (rep > 0) best = std::min(best, double(ms) * 1e3);
  }
  return best;
}

double best_timed_rate(int reps, double bytes, const std::function<void(int rep)>& one_rep) {
  return bytes / (best_event_ms(nullptr, reps, "bandwidth", one_rep) * 1e-3);
}

double rows_read_bandwidth(int N, int K, int S, int launches, int variant) {
  const size_t bytes = size_t(N) * size_t(K) * 2;
  // The shared-memory variants' dynamic shared memory, opted into once, outside the timing.
  constexpr size_t smem3 = 4 * 3 * 16 * (64 * 4 + 16), smem4 = 4 * 3 * 16 * (64 * 8 + 16),
                   smem5 = 4 * 4 * 16 * (64 * 4 + 16);
  check(cudaFuncSetAttribute(rows_smem_kernel<4, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem3)),
        "bandwidth", "cudaFuncSetAttribute");
  check(cudaFuncSetAttribute(rows_smem_kernel<8, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem4)),
        "bandwidth", "cudaFuncSetAttribute");
  check(cudaFuncSetAttribute(rows_smem_kernel<4, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem5)),
        "bandwidth", "cudaFuncSetAttribute");
  const unsigned rows16 = unsigned((N / 16 + 8 / S - 1) / (8 / S)), rows8 = unsigned((N / 8 + 8 / S - 1) / (8 / S));
  // The shared-memory variants' 4-warp blocks hold 4 / S groups (S at most 4 for them; the
  // others take up to 8, where 4 / S is 0: computed as at least 1 so that no S divides by zero).
  const int smem_groups = std::max(4 / S, 1);
  const unsigned smem_blocks = unsigned((N / 16 + smem_groups - 1) / smem_groups);
  auto launch = [&](const char* w, unsigned* sink) {
    switch (variant) {
      case 0: rows_kernel<16, 4><<<rows16, 256>>>(w, N, K, S, sink); break;
      case 1: rows_kernel<8, 8><<<rows8, 256>>>(w, N, K, S, sink); break;
      case 2: rows_kernel<8, 4><<<rows8, 256>>>(w, N, K, S, sink); break;
      case 3: rows_smem_kernel<4, 3><<<smem_blocks, 128, smem3>>>(w, N, K, S, sink); break;
      case 4: rows_smem_kernel<8, 3><<<smem_blocks, 128, smem4>>>(w, N, K, S, sink); break;
      case 5: rows_smem_kernel<4, 4><<<smem_blocks, 128, smem5>>>(w, N, K, S, sink); break;
      case 6: rows_kernel<16, 4, 1><<<rows16, 256>>>(w, N, K, S, sink); break;
      case 7: rows_kernel<16, 4, 2><<<rows16, 256>>>(w, N, K, S, sink); break;
      case 9: rows_kernel<16, 4, 0, true><<<rows16, 256>>>(w, N, K, S, sink); break;
      default: rows_kernel<16, 4, 3><<<rows16, 256>>>(w, N, K, S, sink); break;
    }
  };
  return best_read_rate(bytes * launches, [&](const char* buf, unsigned* sink) {
    for (int l = 0; l < launches; ++l) launch(buf + size_t(l) * bytes, sink);
  });
}

double read_bandwidth(size_t window, size_t total, int flavour, int unroll, int blocks_per_sm) {
  window = std::max<size_t>(window / 16 * 16, 16);
  total = std::max(total / window, size_t(1)) * window;
  const int sms = sm_count("bandwidth");
  const unsigned blocks = unsigned(sms * blocks_per_sm);
  const int64_t n = int64_t(window / 16);
  if (flavour >= 4) {  // bulk copies: (tile, stages) = (16 KiB, 4), (32 KiB, 3), (8 KiB, 8)
    constexpr int k16 = 16 << 10, k32 = 32 << 10, k8 = 8 << 10;
    check(cudaFuncSetAttribute(bulk_read_kernel<k16, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * k16),
          "bandwidth", "cudaFuncSetAttribute");
    check(cudaFuncSetAttribute(bulk_read_kernel<k32, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, 3 * k32),
          "bandwidth", "cudaFuncSetAttribute");
    check(cudaFuncSetAttribute(bulk_read_kernel<k8, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8 * k8),
          "bandwidth", "cudaFuncSetAttribute");
    const int tile = flavour == 4 ? k16 : flavour == 5 ? k32 : k8;
    window = std::max(window / size_t(tile), size_t(1)) * size_t(tile);
    total = std::max(total / window, size_t(1)) * window;
    return best_read_rate(total, [&](const char* buf, unsigned* sink) {
      for (size_t w = 0; w < total / window; ++w) {
        const char* q = buf + w * window;
        const int64_t tiles = int64_t(window / size_t(tile));
        if (flavour == 4) bulk_read_kernel<k16, 4><<<blocks, 256, 4 * k16>>>(q, tiles, sink);
        else if (flavour == 5) bulk_read_kernel<k32, 3><<<blocks, 256, 3 * k32>>>(q, tiles, sink);
        else bulk_read_kernel<k8, 8><<<blocks, 256, 8 * k8>>>(q, tiles, sink);
      }
    });
  }
  // Each launch reads the next window, so a window smaller than L2 is still read from memory.
  return best_read_rate(total, [&](const char* buf, unsigned* sink) {
    for (size_t w = 0; w < total / window; ++w) {
      const auto* p = reinterpret_cast<const uint4*>(buf + w * window);
      if (unroll == 8) read_kernel<0, 8><<<blocks, 256>>>(p, n, sink);
      else if (flavour == 1) read_kernel<1, 4><<<blocks, 256>>>(p, n, sink);
      else if (flavour == 2) read_kernel<2, 4><<<blocks, 256>>>(p, n, sink);
      else if (flavour == 3) read_kernel<3, 4><<<blocks, 256>>>(p, n, sink);
      else read_kernel<0, 4><<<blocks, 256>>>(p, n, sink);
    }
  });
}

ReleaseCosts release_probe(size_t bytes) {
  const int sms = sm_count("bandwidth");
  ReleaseCosts r;
  r.blocks = sms * 2;
  r.tile_bytes = kReleaseTile;
  const int64_t tiles = int64_t(std::max<size_t>(bytes / kReleaseTile, size_t(r.blocks)));
  bytes = size_t(tiles) * kReleaseTile;
  r.releases_per_block = double(tiles) / r.blocks;
  constexpr int kRing = 4 * (16 << 10);
  for (auto* k : {tiled_bulk_kernel<false>, tiled_bulk_kernel<true>})
    check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kRing), "bandwidth",
          "cudaFuncSetAttribute");
  const DeviceBuffer counter(sizeof(unsigned), "bandwidth");
  auto rate = [&](int way) {
    return best_read_rate(bytes, [&](const char* buf, unsigned* sink) {
      auto* c = counter.as<unsigned>();
      const auto blocks = unsigned(r.blocks);
      if (way == 0) tiled_read_kernel<false><<<blocks, 256>>>(reinterpret_cast<const uint4*>(buf), tiles, c, sink);
      if (way == 1) tiled_read_kernel<true><<<blocks, 256>>>(reinterpret_cast<const uint4*>(buf), tiles, c, sink);
      if (way == 2) tiled_bulk_kernel<false><<<blocks, 256, kRing>>>(buf, tiles, c, sink);
      if (way == 3) tiled_bulk_kernel<true><<<blocks, 256, kRing>>>(buf, tiles, c, sink);
      if (way == 4) tiled_read_kernel<false, true><<<blocks, 256>>>(reinterpret_cast<const uint4*>(buf), tiles, c, sink);
    });
  };
  r.loads_gbs = rate(0) / 1e9;
  r.loads_release_gbs = rate(1) / 1e9;
  r.bulk_gbs = rate(2) / 1e9;
  r.bulk_release_gbs = rate(3) / 1e9;
  r.rows_gbs = rate(4) / 1e9;
  // The time the releases added, spread over each block's releases.
  auto per_release_us = [&](double without, double with) {
    return (double(bytes) / (with * 1e9) - double(bytes) / (without * 1e9)) * 1e6 / r.releases_per_block;
  };
  r.loads_release_us = per_release_us(r.loads_gbs, r.loads_release_gbs);
  r.bulk_release_us = per_release_us(r.bulk_gbs, r.bulk_release_gbs);
  return r;
}


BulkProductRates bulk_product_probe(int M, int N, int K) {
  BulkProductRates r;
  r.M = M, r.N = N, r.K = K;
  if (M < 1 || M > 16 || N % kBulkRows != 0 || K % 1024 != 0) return r;
  const size_t w_bytes = size_t(N) * size_t(K) * 2;
  // Several weights read back to back (each read once a rep, so from memory, not L2), at least
  // 512 MiB a rep, as the decode step's products follow each other.
  const int launches = int(std::clamp<size_t>(((size_t(512) << 20) + w_bytes - 1) / w_bytes, 2, 8));
  const DeviceBuffer w(w_bytes * launches, "bulk product"), x(size_t(M) * K * 2, "bulk product");
  const DeviceBuffer y_bulk(size_t(M) * N * 4, "bulk product"), y_loads(size_t(M) * N * 4, "bulk product");
  {  // bf16 values in [-1, 1): a fixed pseudo-random pattern (the two products are compared, not a reference)
    std::vector<uint16_t> h(std::max(size_t(M) * K, size_t(1) << 20));
    uint32_t v = 12345u;
    for (auto& e : h) {
      v = v * 1664525u + 1013904223u;
      const float f = float(int32_t(v >> 8) - (1 << 23)) / float(1 << 23);
      e = f32_to_bf16(f);
    }
    check(cudaMemcpy(x.as(), h.data(), size_t(M) * K * 2, cudaMemcpyHostToDevice), "bulk product", "cudaMemcpy");
    for (size_t at = 0; at < w_bytes * launches; at += h.size() * 2)
      check(cudaMemcpy(w.as<char>() + at, h.data(), std::min(h.size() * 2, w_bytes * launches - at),
                       cudaMemcpyHostToDevice),
            "bulk product", "cudaMemcpy");
  }
  const int sms = sm_count("bulk product");
  const unsigned blocks = unsigned(std::min<int64_t>(N / kBulkRows, int64_t(sms) * 2));
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "bulk product", "cudaStreamCreate");
  const auto* xp = x.as<const __nv_bfloat16>();
  auto weight = [&](int l) { return reinterpret_cast<const __nv_bfloat16*>(w.as<const char>() + size_t(l) * w_bytes); };
  // Way 0 the backend's kernel; ways 1-3 the bulk variants (BulkProductRates), each with its
  // ring's shared memory allowed once, before any timing.
  constexpr auto bulk1 = bulk_product_kernel<512, 4, false>, bulk2 = bulk_product_kernel<512, 4, true>,
                 bulk3 = bulk_product_kernel<1024, 3, true>;
  constexpr int ring1 = bulk_ring_bytes<512, 4>(), ring3 = bulk_ring_bytes<1024, 3>();
  for (const auto& [kernel, smem] : {std::pair{bulk1, ring1}, std::pair{bulk2, ring1}, std::pair{bulk3, ring3}})
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "bulk product",
          "cudaFuncSetAttribute");
  auto run = [&](int way) {
    for (int l = 0; l < launches; ++l) {
      if (way == 0) skinny_matmul(xp, K, weight(l), K, y_loads.as(), N, Elem::F32, M, N, K, false, true, s);
      if (way == 1) bulk1<<<blocks, 256, ring1, s>>>(xp, weight(l), y_bulk.as<float>(), M, N, K);
      if (way == 2) bulk2<<<blocks, 256, ring1, s>>>(xp, weight(l), y_bulk.as<float>(), M, N, K);
      if (way == 3) bulk3<<<blocks, 256, ring3, s>>>(xp, weight(l), y_bulk.as<float>(), M, N, K);
    }
    check(cudaGetLastError(), "bulk product", "kernel launch");
  };
  auto time_us = [&](int way) { return best_event_ms(s, 6, "bulk product", [&](int) { run(way); }) * 1e3 / launches; };
  // Alternating rounds, so that no way gets the warmer GPU; each way's output compared with the
  // backend's right after it ran.
  double us[4] = {1e30, 1e30, 1e30, 1e30};
  std::vector<float> a(size_t(M) * N), b(size_t(M) * N);
  for (int round = 0; round < 2; ++round)
    for (int way = 0; way < 4; ++way) {
      us[way] = std::min(us[way], time_us(way));
      if (round == 1 && way > 0) {
        check(cudaStreamSynchronize(s), "bulk product", "cudaStreamSynchronize");
        check(cudaMemcpy(a.data(), y_loads.as(), a.size() * 4, cudaMemcpyDeviceToHost), "bulk product", "cudaMemcpy");
        check(cudaMemcpy(b.data(), y_bulk.as(), b.size() * 4, cudaMemcpyDeviceToHost), "bulk product", "cudaMemcpy");
        double diff = 0, scale = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          diff = std::max(diff, double(std::fabs(a[i] - b[i])));
          scale = std::max(scale, double(std::fabs(a[i])));
        }
        r.max_rel_diff = std::max(r.max_rel_diff, scale > 0 ? diff / scale : diff);
      }
    }
  check(cudaStreamSynchronize(s), "bulk product", "cudaStreamSynchronize");
  cudaStreamDestroy(s);
  r.launches = launches;
  for (int way = 0; way < 4; ++way) {
    r.us[way] = us[way];
    r.gbs[way] = double(w_bytes) / (us[way] * 1e3);
  }
  r.ran = true;
  return r;
}

}  // namespace dflash::cuda
