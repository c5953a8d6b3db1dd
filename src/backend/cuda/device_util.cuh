#pragma once
// Device-side helpers shared by the kernels: element loads/stores through f32, warp reductions
// and the bf16 unpacking of 16-byte vectors.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_common.h"

namespace dflash::cuda {

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
// Round to nearest even, as the host-side f32_to_bf16 and PyTorch do.
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Eight bf16 packed in a 16-byte vector, widened exactly (bf16 is the top half of an f32).
__device__ __forceinline__ void unpack_bf16x8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// Dispatches a functor templated on the element type named by `e`.
template <typename F>
void dispatch_elem(Elem e, F&& f) {
  if (e == Elem::F32) f(float{});
  else f(__nv_bfloat16{});
}

}  // namespace dflash::cuda
