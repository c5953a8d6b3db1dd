// The small memory-bound ops: SiLU-and-multiply, embedding gather, strided copy with dtype
// conversion, residual add. One thread per element; all are a few percent of a step at most.
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/swiglu.cuh"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 256;

template <typename In, typename Out>
__global__ void silu_mul_kernel(const In* gu, int64_t ld_gu, Out* out, int64_t ldo, int64_t rows, int64_t inter) {
  grid_dependency_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * inter) return;
  const int64_t r = i / inter, c = i % inter;
  const float g = to_f32(gu[r * ld_gu + c]), u = to_f32(gu[r * ld_gu + inter + c]);
  out[r * ldo + c] = from_f32<Out>(silu_mul_f32(g, u));
}

// bf16 → bf16 with 16-byte rows (a prompt's gate_up, whose scalar loads made the op four times
// slower than its bytes at 512 rows): eight columns a thread, the same arithmetic.
__global__ void silu_mul_bf16x8_kernel(const __nv_bfloat16* gu, int64_t ld_gu, __nv_bfloat16* out, int64_t ldo,
                                       int64_t rows, int64_t inter) {
  grid_dependency_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, per_row = inter / 8;
  if (i >= rows * per_row) return;
  const int64_t r = i / per_row, c = (i % per_row) * 8;
  float g[8], u[8];
  unpack_bf16x8(*reinterpret_cast<const uint4*>(gu + r * ld_gu + c), g);
  unpack_bf16x8(*reinterpret_cast<const uint4*>(gu + r * ld_gu + inter + c), u);
  uint32_t packed[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(silu_mul_f32(g[2 * e], u[2 * e]), silu_mul_f32(g[2 * e + 1], u[2 * e + 1]));
    packed[e] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  *reinterpret_cast<uint4*>(out + r * ldo + c) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

template <typename In, typename Out>
__global__ void embed_kernel(const int32_t* ids, int64_t n, const In* table, int64_t ld_table, int64_t cols, Out* out,
                             int64_t ldo) {
  grid_dependency_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * cols) return;
  const int64_t r = i / cols, c = i % cols;
  out[r * ldo + c] = from_f32<Out>(to_f32(table[int64_t(ids[r]) * ld_table + c]));
}

template <typename In, typename Out>
__global__ void copy_kernel(const In* src, int64_t lds, Out* dst, int64_t ldd, int64_t rows, int64_t cols) {
  grid_dependency_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  dst[r * ldd + c] = from_f32<Out>(to_f32(src[r * lds + c]));
}

template <typename In, typename Out>
__global__ void add_kernel(const In* x, int64_t ldx, Out* y, int64_t ldy, int64_t rows, int64_t cols) {
  grid_dependency_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  y[r * ldy + c] = from_f32<Out>(to_f32(y[r * ldy + c]) + to_f32(x[r * ldx + c]));
}

}  // namespace

void silu_mul(const void* gate_up, int64_t ld_gu, Elem gu_elem, void* out, int64_t ldo, Elem out_elem, int64_t rows,
              int64_t inter, cudaStream_t s) {
  if (rows * inter == 0) return;
  if (gu_elem == Elem::BF16 && out_elem == Elem::BF16 && inter % 8 == 0 && rows_aligned16(gate_up, ld_gu, 2) &&
      rows_aligned16(out, ldo, 2)) {
    launch_kernel("silu_mul", silu_mul_bf16x8_kernel, blocks_for(rows * inter / 8, kThreads), kThreads, 0, s,
                  static_cast<const __nv_bfloat16*>(gate_up), ld_gu, static_cast<__nv_bfloat16*>(out), ldo, rows, inter);
    return;
  }
  dispatch_elem(gu_elem, [&](auto in) {
    dispatch_elem(out_elem, [&](auto o) {
      using In = decltype(in);
      using Out = decltype(o);
      launch_kernel("silu_mul", silu_mul_kernel<In, Out>, blocks_for(rows * inter, kThreads), kThreads, 0, s,
          static_cast<const In*>(gate_up), ld_gu, static_cast<Out*>(out), ldo, rows, inter);
    });
  });
}

void embed(const int32_t* ids, int64_t n, const void* table, int64_t ld_table, Elem table_elem, int64_t cols,
           void* out, int64_t ldo, Elem out_elem, cudaStream_t s) {
  if (n * cols == 0) return;
  dispatch_elem(table_elem, [&](auto in) {
    dispatch_elem(out_elem, [&](auto o) {
      using In = decltype(in);
      using Out = decltype(o);
      launch_kernel("embed", embed_kernel<In, Out>, blocks_for(n * cols, kThreads), kThreads, 0, s,
          ids, n, static_cast<const In*>(table), ld_table, cols, static_cast<Out*>(out), ldo);
    });
  });
}

void copy_convert(const void* src, int64_t lds, Elem src_elem, void* dst, int64_t ldd, Elem dst_elem, int64_t rows,
                  int64_t cols, cudaStream_t s) {
  if (rows * cols == 0) return;
  dispatch_elem(src_elem, [&](auto in) {
    dispatch_elem(dst_elem, [&](auto o) {
      using In = decltype(in);
      using Out = decltype(o);
      launch_kernel("copy", copy_kernel<In, Out>, blocks_for(rows * cols, kThreads), kThreads, 0, s,
          static_cast<const In*>(src), lds, static_cast<Out*>(dst), ldd, rows, cols);
    });
  });
}

void add(const void* x, int64_t ldx, Elem x_elem, void* y, int64_t ldy, Elem y_elem, int64_t rows, int64_t cols,
         cudaStream_t s) {
  if (rows * cols == 0) return;
  dispatch_elem(x_elem, [&](auto in) {
    dispatch_elem(y_elem, [&](auto o) {
      using In = decltype(in);
      using Out = decltype(o);
      launch_kernel("add", add_kernel<In, Out>, blocks_for(rows * cols, kThreads), kThreads, 0, s,
          static_cast<const In*>(x), ldx, static_cast<Out*>(y), ldy, rows, cols);
    });
  });
}

}  // namespace dflash::cuda
