// Greedy token choice on the device: one block per logits row. Ties go to the lowest index,
// as std::max_element does on the CPU, so both backends pick the same token from equal rows.
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__global__ void argmax_kernel(const float* x, int64_t ldx, int64_t cols, int32_t* out) {
  const float* row = x + int64_t(blockIdx.x) * ldx;
  float v = -INFINITY;
  int i = 0x7fffffff;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) better(v, i, row[c], static_cast<int>(c));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    better(v, i, ov, oi);
  }
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) better(v, i, sv[w], si[w]);
    // A row of only -inf / NaN: index 0, as max_element would return.
    out[blockIdx.x] = i == 0x7fffffff ? 0 : i;
  }
}

}  // namespace

void argmax_rows(const float* x, int64_t ldx, int64_t rows, int64_t cols, int32_t* out, cudaStream_t s) {
  if (rows == 0) return;
  argmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x, ldx, cols, out);
  check_launch("argmax_rows");
}

}  // namespace dflash::cuda
