// Grouped RMSNorm: one block per (row, group). With group = hidden size it is the layer norm;
// with group = head_dim it is Qwen3's per-head q/k norm over a [T, heads·head_dim] view.
//
// Two kernels. The vector kernel (16-byte-aligned f32 rows, 8-byte-aligned bf16 rows, group a
// multiple of 4) gives each thread one to four 4-element vectors of the group, held in
// registers from the load to the store: a 4096-wide row is one load per thread of a
// 1024-thread block, then one warp butterfly and one pass over the warps' partial sums. The
// scalar kernel is the general case. In both, the block shape and every thread's share of the
// group depend on the group size alone, so a row's sum of squares is added in the same order
// whatever the number of rows (batch invariance, docs/cuda.md). The vector kernel also starts
// a forward pass's deferred norm (norm_emit below, kernels.h's SkinnyNorm).
#include <algorithm>
#include <string>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

template <typename In, typename W, typename Out>
__global__ void rms_norm_kernel(const In* x, int64_t ldx, const W* w, Out* y, int64_t ldy, int64_t groups,
                                int64_t group, float eps) {
  grid_dependency_begin();
  const int64_t r = blockIdx.x / groups, g = blockIdx.x % groups;
  const In* in = x + r * ldx + g * group;
  Out* out = y + r * ldy + g * group;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < group; i += blockDim.x) {
    const float v = to_f32(in[i]);
    ss += v * v;
  }
  __shared__ float partial[32];
  const float total = block_sum(ss, partial);  // its barrier also protects y aliasing x
  const float inv = rsqrtf(total / static_cast<float>(group) + eps);
  for (int64_t i = threadIdx.x; i < group; i += blockDim.x)
    out[i] = from_f32<Out>(to_f32(w[i]) * (to_f32(in[i]) * inv));
}

// Four elements of a row as one aligned vector load / store.
__device__ __forceinline__ void load4(const float* p, float (&v)[4]) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
__device__ __forceinline__ void load4(const __nv_bfloat16* p, float (&v)[4]) {
  const uint2 q = *reinterpret_cast<const uint2*>(p);
  v[0] = __uint_as_float(q.x << 16), v[1] = __uint_as_float(q.x & 0xffff0000u);
  v[2] = __uint_as_float(q.y << 16), v[3] = __uint_as_float(q.y & 0xffff0000u);
}
__device__ __forceinline__ void store4(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, const float (&v)[4]) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
  uint2 q;
  q.x = *reinterpret_cast<const uint32_t*>(&a);
  q.y = *reinterpret_cast<const uint32_t*>(&b);
  *reinterpret_cast<uint2*>(p) = q;
}

constexpr int kMaxVecPerThread = 4;  // groups up to 4 · 4 · 1024 = 16384 elements

// Threads per block of the vector kernel, from the group size only.
int vec_threads(int64_t group) { return static_cast<int>(std::min<int64_t>(1024, (group / 4 + 31) / 32 * 32)); }

// One block of vec_threads(group) threads per (row, group). Thread i owns vectors i, i + T, …
// (at most kMaxVecPerThread); its sum of squares adds them in that order, each vector's four
// squares left to right; then the warp butterfly; then the warps' sums in warp order.
// EMIT (the first deferred norm of a pass, norm_emit below): y = w ⊙ x without the 1/rms,
// and the row's sum of squares to partial_out[r] (groups must be 1). GATHER (with EMIT,
// embed_norm_emit below): row r of x is the table row ids[r], and its values are stored as f32
// to gathered[r] as well (the embedding's output, the residual stream).
template <typename In, typename W, typename Out, bool EMIT, bool GATHER = false>
__global__ void __launch_bounds__(1024)
    rms_norm_vec_kernel(const In* x, int64_t ldx, const W* w, Out* y, int64_t ldy, int64_t groups, int64_t group,
                        float eps, float* partial_out, const int32_t* ids, float* gathered, int64_t ld_gathered) {
  grid_dependency_begin();
  const int64_t r = blockIdx.x / groups, g = blockIdx.x % groups;
  const In* in = GATHER ? x + int64_t(ids[r]) * ldx : x + r * ldx + g * group;
  const int nvec = static_cast<int>(group / 4);
  float v[kMaxVecPerThread][4];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxVecPerThread; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < nvec) {
      load4(in + 4 * i, v[j]);
      if constexpr (GATHER) store4(gathered + r * ld_gathered + 4 * i, v[j]);
#pragma unroll
      for (int e = 0; e < 4; ++e) ss = __fmaf_rn(v[j][e], v[j][e], ss);
    }
  }
  __shared__ float partial[32];
  const float total = block_sum(ss, partial);  // its barrier also protects y aliasing x
  const float inv = rsqrtf(total / static_cast<float>(group) + eps);
  if (EMIT && threadIdx.x == 0) partial_out[r] = total;
  Out* out = y + r * ldy + g * group;
#pragma unroll
  for (int j = 0; j < kMaxVecPerThread; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i < nvec) {
      float wv[4], o[4];
      load4(w + 4 * i, wv);
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] = EMIT ? __fmul_rn(wv[e], v[j][e]) : __fmul_rn(wv[e], __fmul_rn(v[j][e], inv));
      store4(out + 4 * i, o);
    }
  }
}

template <typename T>
bool vec_aligned(const void* p, int64_t ld) {
  return reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0 && ld % 4 == 0;
}

bool vec_group(int64_t group) { return group % 4 == 0 && group / 4 <= int64_t(kMaxVecPerThread) * 1024; }

}  // namespace

void rms_norm(const void* x, int64_t ldx, Elem x_elem, const void* w, Elem w_elem, void* y, int64_t ldy,
              Elem y_elem, int64_t rows, int64_t cols, int64_t group, float eps, cudaStream_t s) {
  const int64_t groups = cols / group, blocks = rows * groups;
  if (blocks == 0) return;
  dispatch_elem(x_elem, [&](auto xi) {
    dispatch_elem(w_elem, [&](auto wi) {
      dispatch_elem(y_elem, [&](auto yi) {
        using In = decltype(xi);
        using W = decltype(wi);
        using Out = decltype(yi);
        // Judged from base pointers and strides, never from rows: a row alone and the same row
        // in its block take the same kernel. (w's offset per group is a multiple of 4.)
        const bool vec = vec_group(group) && vec_aligned<In>(x, ldx) && vec_aligned<W>(w, 0) &&
                         vec_aligned<Out>(y, ldy);
        if (vec) {
          launch_kernel("rms_norm", rms_norm_vec_kernel<In, W, Out, false>, static_cast<unsigned>(blocks),
                        vec_threads(group), 0, s,
              static_cast<const In*>(x), ldx, static_cast<const W*>(w), static_cast<Out*>(y), ldy, groups, group, eps,
              nullptr, nullptr, nullptr, int64_t(0));
        } else {
          const int threads = static_cast<int>(std::min<int64_t>(256, (group + 31) / 32 * 32));
          launch_kernel("rms_norm", rms_norm_kernel<In, W, Out>, static_cast<unsigned>(blocks), threads, 0, s,
              static_cast<const In*>(x), ldx, static_cast<const W*>(w), static_cast<Out*>(y), ldy, groups, group,
              eps);
        }
      });
    });
  });
}

void norm_emit(const float* x, int64_t ldx, const float* norm_w, __nv_bfloat16* h, int64_t ldh, float* partial,
               int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows == 0) return;
  if (!vec_group(cols) || !vec_aligned<float>(x, ldx) || !vec_aligned<float>(norm_w, 0) ||
      !vec_aligned<__nv_bfloat16>(h, ldh))
    throw Error("cuda norm_emit: rows of " + std::to_string(cols) + " need 16-byte-aligned vectors of 4");
  launch_kernel("rms_norm", rms_norm_vec_kernel<float, float, __nv_bfloat16, true>, static_cast<unsigned>(rows),
                vec_threads(cols), 0, s, x, ldx, norm_w, h, ldh, 1, cols, 0.f, partial, nullptr, nullptr, int64_t(0));
}

bool embed_norm_emit_applies(const void* table, int64_t ld_table, Elem table_elem, const float* x, int64_t ldx,
                             const float* norm_w, const __nv_bfloat16* h, int64_t ldh, int64_t cols) {
  const bool table_vec = table_elem == Elem::F32 ? vec_aligned<float>(table, ld_table)
                                                 : vec_aligned<__nv_bfloat16>(table, ld_table);
  return vec_group(cols) && table_vec && vec_aligned<float>(x, ldx) && vec_aligned<float>(norm_w, 0) &&
         vec_aligned<__nv_bfloat16>(h, ldh);
}

void embed_norm_emit(const int32_t* ids, const void* table, int64_t ld_table, Elem table_elem, float* x, int64_t ldx,
                     const float* norm_w, __nv_bfloat16* h, int64_t ldh, float* partial, int64_t rows, int64_t cols,
                     cudaStream_t s) {
  if (rows == 0) return;
  if (!embed_norm_emit_applies(table, ld_table, table_elem, x, ldx, norm_w, h, ldh, cols))
    throw Error("cuda embed_norm_emit: rows of " + std::to_string(cols) + " need 16-byte-aligned vectors of 4");
  dispatch_elem(table_elem, [&](auto ti) {
    using In = decltype(ti);
    launch_kernel("rms_norm", rms_norm_vec_kernel<In, float, __nv_bfloat16, true, true>, static_cast<unsigned>(rows),
                  vec_threads(cols), 0, s, static_cast<const In*>(table), ld_table, norm_w, h, ldh, int64_t(1), cols,
                  0.f, partial, ids, x, ldx);
  });
}

}  // namespace dflash::cuda
