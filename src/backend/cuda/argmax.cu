// Greedy token choice on the device. Ties go to the lowest index, as std::max_element does on
// the CPU, so both backends pick the same token from equal rows; NaNs never win, and a row
// with nothing but -inf / NaN gives index 0.
//
// Two launches: many blocks per row each reduce one contiguous slice (16-byte loads when the
// row allows), then one block per row reduces the slices' (value, index) pairs. "Larger value,
// else lower index" is a total order on the pairs, so the answer does not depend on how the
// row is cut or in which order pairs meet. (One block per row read a 152k-entry vocabulary row
// at the pace of one SM: ~80 µs.)
#include <algorithm>
#include <string>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/greedy_order.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kSliceTarget = 4096;  // elements per block: four 16-byte loads per thread
constexpr int kMaxSlices = 1024;
// The block's best pair into (v, i) of thread 0.
__device__ __forceinline__ void block_best(float& v, int& i) {
  warp_best(v, i);
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = i;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) keep_better(v, i, sv[w], si[w]);
}

// Block (b, r) reduces columns [b·slice, min(cols, (b + 1)·slice)) of row r. vec: the row start
// and slice are multiples of 4 elements on a 16-byte aligned base.
__global__ void __launch_bounds__(kThreads)
    argmax_slices_kernel(const float* __restrict__ x, int64_t ldx, int64_t cols, int64_t slice, bool vec,
                         float* __restrict__ part_v, int* __restrict__ part_i) {
  grid_dependency_begin();
  const float* row = x + int64_t(blockIdx.y) * ldx;
  const int64_t c0 = int64_t(blockIdx.x) * slice, c1 = min(cols, c0 + slice);
  float v = -INFINITY;
  int i = kNoColumn;
  if (vec) {
    const int64_t n4 = (c1 - c0) / 4;
#pragma unroll 4
    for (int64_t k = threadIdx.x; k < n4; k += kThreads) {
      const float4 f = reinterpret_cast<const float4*>(row + c0)[k];
      const int c = static_cast<int>(c0 + 4 * k);
      keep_better(v, i, f.x, c);
      keep_better(v, i, f.y, c + 1);
      keep_better(v, i, f.z, c + 2);
      keep_better(v, i, f.w, c + 3);
    }
    for (int64_t c = c0 + 4 * n4 + threadIdx.x; c < c1; c += kThreads) keep_better(v, i, row[c], static_cast<int>(c));
  } else {
    for (int64_t c = c0 + threadIdx.x; c < c1; c += kThreads) keep_better(v, i, row[c], static_cast<int>(c));
  }
  block_best(v, i);
  if (threadIdx.x == 0) {
    part_v[int64_t(blockIdx.y) * gridDim.x + blockIdx.x] = v;
    part_i[int64_t(blockIdx.y) * gridDim.x + blockIdx.x] = i;
  }
}

__global__ void __launch_bounds__(kThreads)
    argmax_final_kernel(const float* __restrict__ part_v, const int* __restrict__ part_i, int slices,
                        int32_t* __restrict__ out) {
  grid_dependency_begin();
  float v = -INFINITY;
  int i = kNoColumn;
  for (int b = threadIdx.x; b < slices; b += blockDim.x)
    keep_better(v, i, part_v[int64_t(blockIdx.x) * slices + b], part_i[int64_t(blockIdx.x) * slices + b]);
  block_best(v, i);
  if (threadIdx.x == 0) out[blockIdx.x] = i == kNoColumn ? 0 : i;
}

int slices_for(int64_t cols) {
  return static_cast<int>(std::clamp<int64_t>((cols + kSliceTarget - 1) / kSliceTarget, 1, kMaxSlices));
}

}  // namespace

size_t argmax_scratch_bytes(int64_t rows, int64_t cols) {
  return size_t(rows) * slices_for(cols) * (sizeof(float) + sizeof(int));
}

void argmax_rows(const float* x, int64_t ldx, int64_t rows, int64_t cols, int32_t* out, void* scratch,
                 cudaStream_t s) {
  if (rows == 0) return;
  if (cols > INT32_MAX) throw Error("cuda argmax_rows: " + std::to_string(cols) + " columns");
  if (rows > 65535) throw Error("cuda argmax_rows: " + std::to_string(rows) + " rows");
  const int slices = slices_for(cols);
  const int64_t slice = ((cols + slices - 1) / slices + 3) / 4 * 4;  // a multiple of 4 for the 16-byte loads
  const bool vec = rows_aligned16(x, ldx, 4);
  auto* part_v = static_cast<float*>(scratch);
  auto* part_i = reinterpret_cast<int*>(part_v + int64_t(rows) * slices);
  launch_kernel("argmax_rows", argmax_slices_kernel, dim3(static_cast<unsigned>(slices), static_cast<unsigned>(rows)),
                kThreads, 0, s, x, ldx, cols, slice, vec, part_v, part_i);
  launch_kernel("argmax_rows", argmax_final_kernel, static_cast<unsigned>(rows),
                slices <= 32 ? 32 : slices <= 128 ? 128 : kThreads, 0, s, part_v, part_i, slices, out);
}

}  // namespace dflash::cuda
