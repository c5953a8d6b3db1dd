// Qwen3's per-head q/k RMSNorm, RoPE and the KV-cache store in one launch (they were six:
// two norms, two ropes, two copies, each a few microseconds of launch for a few KB of data).
// One block per (row, head) of q, k and v; the arithmetic and roundings are those of the
// separate kernels (norm in f32, round to bf16, rotate in f32, round), so results equal the
// unfused path's bit for bit.
#include <algorithm>
#include <string>

#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/qk_norm_rope.cuh"

namespace dflash::cuda {
namespace {

__global__ void qk_norm_rope_store_kernel(const QkNormRopeArgs a) {
  grid_dependency_begin();
  __shared__ float partial[32];
  __shared__ float normed[512];
  qk_norm_rope_unit<false>(a, blockIdx.x, threadIdx.x, blockDim.x, partial, normed);
}

}  // namespace

void qk_norm_rope_store(void* q, int64_t ldq, int64_t hq, const void* k, int64_t ldk, const void* v, int64_t ldv,
                        int64_t hkv, const float* q_norm, const float* k_norm, float eps, int64_t rows,
                        int64_t head_dim, const int32_t* positions, int64_t pos0, const float* cos, const float* sin,
                        void* k_dst, int64_t ldkd, void* v_dst, int64_t ldvd, cudaStream_t s) {
  if (head_dim > 512 || head_dim % 2) throw Error("cuda qk_norm_rope_store: head_dim " + std::to_string(head_dim));
  const int64_t blocks = rows * (hq + 2 * hkv);
  if (blocks == 0) return;
  const QkNormRopeArgs a{static_cast<__nv_bfloat16*>(q), ldq, static_cast<int>(hq), static_cast<const __nv_bfloat16*>(k), ldk,
                         static_cast<const __nv_bfloat16*>(v), ldv, static_cast<int>(hkv), q_norm, k_norm, eps,
                         static_cast<int>(head_dim), positions, pos0, cos, sin, static_cast<__nv_bfloat16*>(k_dst), ldkd,
                         static_cast<__nv_bfloat16*>(v_dst), ldvd};
  launch_kernel("qk_norm_rope_store", qk_norm_rope_store_kernel, static_cast<unsigned>(blocks),
                qk_norm_unit_threads(static_cast<int>(head_dim)), 0, s, a);
}

}  // namespace dflash::cuda
