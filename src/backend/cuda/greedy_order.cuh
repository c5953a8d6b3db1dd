#pragma once
// The order a greedy choice reduces (value, column) pairs in, shared by argmax_rows (argmax.cu)
// and the argmax inside the LM head's product (skinny_matmul.cu), which must choose the same
// token: larger value, else lower column. It is a total order, so neither how a row is cut nor
// the order pairs meet changes the answer, and NaN, never larger nor equal, never wins; a row of
// nothing but -inf / NaN keeps kNoColumn, read as column 0.
#include <cuda_runtime.h>

namespace dflash::cuda {

constexpr int kNoColumn = 0x7fffffff;

__device__ __forceinline__ void keep_better(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// The warp's best pair, in every lane.
__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    keep_better(v, i, ov, oi);
  }
}

}  // namespace dflash::cuda
