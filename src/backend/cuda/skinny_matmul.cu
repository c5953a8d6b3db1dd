// y (+)= x · wᵀ for the few rows of a decode or verification step (M ≤ 32), where the cost is
// streaming w once from memory. One warp owns R rows of w; its lanes walk K in 16-byte
// chunks (8 bf16), keep M·R f32 partial sums, and reduce them with a fixed butterfly.
//
// Batch invariance: the partial sum of output (m, n) sees the same chunks in the same order,
// and the same butterfly, for any M and any R. cuBLAS gives no such promise (it picks kernels,
// split-K and tile orders by shape), which is why verification rows must not go through it
// while plain decoding rows go through this kernel.
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace dflash::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;  // chunks loaded before the first is used: loads in flight per lane

template <int MT, int R, typename Out>
__global__ void __launch_bounds__(kWarps * 32)
    skinny_vec_kernel(const __nv_bfloat16* __restrict__ x, int64_t ldx, const __nv_bfloat16* __restrict__ w,
                      int64_t ldw, Out* __restrict__ y, int64_t ldy, int M, int N, int K, bool accumulate) {
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

// Any K, any alignment (tiny models, odd views): one element per lane per step. Slow, rare.
template <typename Out>
__global__ void skinny_scalar_kernel(const __nv_bfloat16* __restrict__ x, int64_t ldx,
                                     const __nv_bfloat16* __restrict__ w, int64_t ldw, Out* __restrict__ y,
                                     int64_t ldy, int M, int N, int K, bool accumulate) {
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
  kernel<<<blocks_for(N, kWarps * R), kWarps * 32, smem, s>>>(static_cast<const __nv_bfloat16*>(x), ldx,
                                                              static_cast<const __nv_bfloat16*>(w), ldw,
                                                              static_cast<Out*>(y), ldy, M, N, K, accumulate);
}

template <int MT, typename Out>
void launch_vec(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy, int M, int N, int K,
                bool accumulate, cudaStream_t s) {
  // More rows of w per warp when M is large: each x chunk fetched is used R times.
  constexpr int R = MT >= 32 ? 2 : MT >= 8 ? 4 : MT >= 2 ? 2 : 1;
  const unsigned blocks = blocks_for(N, kWarps * R);
  skinny_vec_kernel<MT, R, Out><<<blocks, kWarps * 32, 0, s>>>(static_cast<const __nv_bfloat16*>(x), ldx,
                                                              static_cast<const __nv_bfloat16*>(w), ldw,
                                                              static_cast<Out*>(y), ldy, M, N, K, accumulate);
}

}  // namespace

void skinny_matmul(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy, Elem y_elem, int M,
                   int N, int K, bool accumulate, cudaStream_t s) {
  if (M == 0 || N == 0) return;
  if (M > kSkinnyMaxRows) throw Error("cuda matmul: skinny kernel called with " + std::to_string(M) + " rows");
  auto aligned = [](const void* p, int64_t ld) { return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld % 8 == 0; };
  const bool vec = K % 8 == 0 && aligned(x, ldx) && aligned(w, ldw);
  dispatch_elem(y_elem, [&](auto yi) {
    using Out = decltype(yi);
    if (!vec) {
      skinny_scalar_kernel<Out><<<blocks_for(N, kWarps), kWarps * 32, 0, s>>>(
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
  check_launch("matmul (skinny)");
}

}  // namespace dflash::cuda
