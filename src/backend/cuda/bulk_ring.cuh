#pragma once
// A ring of shared-memory stages filled by the tensor memory accelerator's 1-D bulk copies
// (cp.async.bulk), each stage's copies completing its mbarrier, as the measuring kernels of
// bandwidth.cu and step_stream_probe.cu use it. sm_90 instructions: callers guard their bodies.
#include <cstdint>

#include "backend/cuda/device_util.cuh"

namespace dflash::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The ring's moves, shared by the bulk kernels: thread 0 sets up the STAGES mbarriers (and the
// block waits for that); one bulk copy of `bytes` into a stage, completing the stage's
// mbarrier; the wait for a stage's mbarrier to complete with `parity`.
template <int STAGES>
__device__ __forceinline__ void ring_init(uint64_t (&landed)[STAGES]) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&landed[s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}
// A stage's refill in two moves, for a stage filled by several copies (bulk_product_kernel):
// the bytes the stage's mbarrier is to expect, then each copy completing on it.
__device__ __forceinline__ void ring_expect(uint64_t* landed, int bytes) {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(landed)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void ring_copy(unsigned char* dst, uint64_t* landed, const void* src, int bytes) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(landed))
               : "memory");
}
__device__ __forceinline__ void ring_issue(unsigned char* stage, uint64_t* landed, const char* src, int bytes) {
  ring_expect(landed, bytes);
  ring_copy(stage, landed, src, bytes);
}
__device__ __forceinline__ void ring_wait(uint64_t* landed, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }"
                 : "=r"(done)
                 : "r"(smem_addr(landed)), "r"(parity)
                 : "memory");
}

constexpr int kBulkRows = 16;
// SK columns a stage (2·SK bytes a row, one copy each), ST stages in the ring; LANES: warp 0's
// first 16 lanes issue a stage's 16 copies at once instead of thread 0 one after another.
template <int SK>
__host__ __device__ constexpr int bulk_row_pitch() { return 2 * SK + 64; }  // bytes: rows g and g + 1 on opposite bank halves
template <int SK, int ST>
__host__ __device__ constexpr int bulk_ring_bytes() { return ST * kBulkRows * bulk_row_pitch<SK>(); }

// A warp's share of one landed stage of SK columns: its SK / 256 chunks of 32 columns of the
// stage's 16 rows, as m16n8k16 mma's into two n8 tiles, with x's fragments `a` (rows g and
// g + 8, 16-byte unit t of each chunk: skinny_matmul.cu's layout) loaded by the caller.
template <int SK>
__device__ __forceinline__ void bulk_stage_mma(const unsigned char* stage, const uint4 (&a)[SK / 256][2],
                                               float (&acc)[2][4], int warp, int g, int t) {
  constexpr int kPitch = bulk_row_pitch<SK>(), kWarpChunks = SK / 256;
#pragma unroll
  for (int cc = 0; cc < kWarpChunks; ++cc) {
    const int off = (t + 4 * (kWarpChunks * warp + cc)) * 16;
    const uint4 b0 = *reinterpret_cast<const uint4*>(stage + g * kPitch + off);
    const uint4 b1 = *reinterpret_cast<const uint4*>(stage + (g + 8) * kPitch + off);
    const uint4 lo = a[cc][0], hi = a[cc][1];
    mma_bf16_16x8x16(acc[0], lo.x, hi.x, lo.y, hi.y, b0.x, b0.y);
    mma_bf16_16x8x16(acc[0], lo.z, hi.z, lo.w, hi.w, b0.z, b0.w);
    mma_bf16_16x8x16(acc[1], lo.x, hi.x, lo.y, hi.y, b1.x, b1.y);
    mma_bf16_16x8x16(acc[1], lo.z, hi.z, lo.w, hi.w, b1.z, b1.w);
  }
}

}  // namespace dflash::cuda
