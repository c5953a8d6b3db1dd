#pragma once
// Device-side helpers shared by the kernels: element loads/stores through f32, warp reductions
// and the bf16 unpacking of 16-byte vectors.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/timeline.cuh"

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

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// One value per thread summed over the block: warp butterflies, then the warp totals in warp
// order, so the order depends only on the block size. Ends past a barrier: every read the block
// made before the call is complete (callers then overwrite their input in place). `partial`
// is 32 values of shared memory.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* partial) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = (blockDim.x + 31) / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T total = 0;
  for (int i = 0; i < warps; ++i) total += partial[i];
  return total;
}

// Inclusive prefix sum over a warp's lanes (lane l gets the sum of lanes 0 … l), in the same
// order on every call.
template <typename T>
__device__ __forceinline__ T warp_inclusive_sum(T v) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const T y = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += y;
  }
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

// 16 bytes of a weight that is streamed once: read-only path, not kept in L1 (it would evict
// the activations every warp re-reads), and a 256-byte L2 prefetch since the neighbouring
// bytes of the row are wanted next.
// (The qualifiers need sm_75; older targets get a plain read-only load.)
__device__ __forceinline__ uint4 ld_stream_16(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
#else
  return __ldg(static_cast<const uint4*>(p));
#endif
}

// d (16x8 f32) += a (16x16 bf16, row-major fragments) · b (16x8 bf16, column fragments) on the
// tensor cores. Lane (g = lane/4, t = lane%4) holds a0 = A[g][2t..2t+1], a1 = A[g+8][2t..2t+1],
// a2 = A[g][2t+8..2t+9], a3 = A[g+8][2t+8..2t+9]; b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g];
// d = D[g][2t..2t+1], D[g+8][2t..2t+1]; of two bf16 in a register, the lower index is in the
// low half (memory order, so a 16-byte load of 8 consecutive elements is 4 ready pairs).
// Needs sm_80; callers check the kernel's PTX version on the host before launching.
__device__ __forceinline__ void mma_bf16_16x8x16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  (void)d, (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1;
  __trap();
#endif
}

// Four (x4) or two (x2) 8x8 bf16 matrices from shared memory, transposed: lanes 8m … 8m + 7
// give the addresses of matrix m's rows (16 bytes each), and lane (g, t) receives in register m
// the elements (row 2t, column g) (low half) and (row 2t + 1, column g) of matrix m: for rows
// that are keys and columns that are head dimensions, the B fragment of a P·V mma.
__device__ __forceinline__ void ldmatrix_trans(uint32_t (&r)[4], const void* smem_row, bool four) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  if (four)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
#else
  (void)r, (void)smem_row, (void)four;
  __trap();
#endif
}

// Programmatic dependent launch (sm_90; launch.cuh sets it up on the host). A kernel may be
// started while the one before it in the stream is still running: everything before
// grid_dependency_begin() must touch no memory that an earlier kernel writes (the first loads
// of uploaded weights are the intended use), everything after it sees all earlier kernels'
// results. Every kernel calls it in every block before it reads or writes anything
// else and before it can exit: the wait covers only the kernel right before, so each kernel
// must itself have waited for its own predecessor for the chain to hold. The trigger that
// follows lets the next kernel be scheduled now that this one has nothing left to wait for;
// it is placed after the wait so at most one kernel waits ahead. No-ops where the kernel was
// launched without the attribute, and on pre-sm_90 targets. The mark it returns is the
// block's entry on the measuring timeline (timeline.cuh; empty in a normal build).
__device__ __forceinline__ TimelineMark grid_dependency_wait();
__device__ __forceinline__ void grid_dependents_launch();
__device__ __forceinline__ TimelineMark grid_dependency_begin() {
  const TimelineMark mark = grid_dependency_wait();
  grid_dependents_launch();
  return mark;
}
// The two halves, for a kernel that lets its dependents in before it waits (the decode merge,
// attention.cu): each still waits for its own predecessor, so the chain holds.
__device__ __forceinline__ TimelineMark grid_dependency_wait() {
  const TimelineArrival arrival = timeline_arrive();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  return timeline_waited(arrival);
}
__device__ __forceinline__ void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// grid_dependency_begin, or with `dependents_first` the two halves the other way round.
__device__ __forceinline__ TimelineMark grid_dependency_begin(bool dependents_first) {
  if (!dependents_first) return grid_dependency_begin();
  grid_dependents_launch();
  return grid_dependency_wait();
}

// Dispatches a functor templated on the element type named by `e`.
template <typename F>
void dispatch_elem(Elem e, F&& f) {
  if (e == Elem::F32) f(float{});
  else f(__nv_bfloat16{});
}

}  // namespace dflash::cuda
