#pragma once
// What the two halves of attention share: attention.cu (the dispatch and the split-KV path of
// decode and verification) and attention_prefill.cu (more than kAttentionSplitMaxRows rows).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dflash::cuda::attention_internal {

inline constexpr int kMaxHeadDim = 256;

// Asynchronous 16-byte global → shared copies (sm_80+); older targets (a PTX-only build for
// them, say) copy synchronously, which the waits then need not cover.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
#else
  *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

__device__ __forceinline__ uint32_t bf16_pair_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }

// What the split and prefill kernels read and write: T query rows against kv_len cached keys, the
// first query at position q_pos0; scores scaled by scale_log2 for exp2.
struct AttentionOperands {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  int64_t ldq, ldk, ldv;
  __nv_bfloat16* out;
  int64_t ldo;
  int64_t T, kv_len, q_pos0;
  int group;  // query heads per KV head
  float scale_log2;
  bool causal;
};

// The prefill path (attention_prefill.cu): flash attention on the tensor cores where the head
// size and alignment allow, one block per (row, head) otherwise. vec: 16-byte aligned K/V rows.
void prefill_attention(const AttentionOperands& o, int64_t hq, int64_t hkv, int D, bool vec, cudaStream_t s);

}  // namespace dflash::cuda::attention_internal
