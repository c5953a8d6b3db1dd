#pragma once
// The SwiGLU activation of one element, shared by silu_mul (elementwise.cu) and the fused
// gate/up product (skinny_matmul.cu), which must produce the same bits: every step is an
// explicitly rounded intrinsic, so no context can contract it into a different FMA.
#include <cuda_runtime.h>

namespace dflash::cuda {

__device__ __forceinline__ float silu_mul_f32(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

}  // namespace dflash::cuda
