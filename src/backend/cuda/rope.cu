// Rotate-half RoPE in place, one thread per (row, head, pair). The cos/sin come from the
// model's RopeTable (already scaled), uploaded once per table growth by the backend, so this
// kernel computes no trigonometry and matches the CPU bit for bit up to the bf16 rounding.
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

__global__ void rope_kernel(__nv_bfloat16* x, int64_t ldx, int64_t rows, int64_t heads, int64_t head_dim,
                            const int32_t* positions, int64_t pos0, const float* cos, const float* sin) {
  grid_dependency_begin();
  const int64_t half = head_dim / 2;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * heads * half) return;
  const int64_t r = i / (heads * half), h = (i / half) % heads, j = i % half;
  const int64_t p = positions ? positions[r] : pos0 + r;
  const float c = cos[p * half + j], s = sin[p * half + j];
  __nv_bfloat16* v = x + r * ldx + h * head_dim;
  const float a = __bfloat162float(v[j]), b = __bfloat162float(v[j + half]);
  v[j] = __float2bfloat16_rn(a * c - b * s);
  v[j + half] = __float2bfloat16_rn(b * c + a * s);
}

}  // namespace

void rope(void* x, int64_t ldx, int64_t rows, int64_t heads, int64_t head_dim, const int32_t* positions,
          int64_t pos0, const float* cos, const float* sin, cudaStream_t s) {
  const int64_t n = rows * heads * (head_dim / 2);
  if (n == 0) return;
  launch_kernel("rope", rope_kernel, blocks_for(n, 256), 256, 0, s, static_cast<__nv_bfloat16*>(x), ldx, rows, heads,
                head_dim, positions, pos0, cos, sin);
}

}  // namespace dflash::cuda
