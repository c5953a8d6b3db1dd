#pragma once
// Copies into the shared memory of every block of a thread-block cluster at once (TMA multicast,
// sm_90a) and the mbarriers that pace them. Only the skinny products' multicast kernel uses them
// (skinny_matmul.cu): there x is read once from L2 for a whole cluster instead of once a block.
// Compiled where the target has the sm_90a features; elsewhere the functions trap, and the host
// never picks the kernel (cluster_multicast_built()).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dflash::cuda {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DFLASH_CLUSTER_COPY 1
#endif

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ unsigned cluster_rank() {
#ifdef DFLASH_CLUSTER_COPY
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
#else
  __trap();
  return 0;
#endif
}

// Every thread of every block of the cluster: what came before (barrier initialisation, remote
// arrivals) is seen by all of them after.
__device__ __forceinline__ void cluster_arrive() {
#ifdef DFLASH_CLUSTER_COPY
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void cluster_wait() {
#ifdef DFLASH_CLUSTER_COPY
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, unsigned count) {
#ifdef DFLASH_CLUSTER_COPY
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
#else
  (void)bar, (void)count;
  __trap();
#endif
}
// After the initialisations, before the cluster barrier that publishes them to the other blocks.
__device__ __forceinline__ void mbarrier_init_fence() {
#ifdef DFLASH_CLUSTER_COPY
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
  __trap();
#endif
}

// The arrivals below are relaxed: a release would first wait for the arriving thread's loads in
// flight, and the multicast kernel's arriving threads stream weights (a release behind 16-byte
// loads costs a loaded-memory round trip, docs/cuda.md What remains item 0; with release arrivals
// a DFlash step took 10.36 against 5.92 ms, H200 2026-12-02). Nothing they publish needs it: the
// data comes through the copies' own completion, and a warp arrives on `empty` after the mma's
// that read its stage have issued, so after those reads have returned.
//
// This block's arrival on its own barrier, announcing `bytes` of copies that will complete on it.
__device__ __forceinline__ void mbarrier_expect_bytes(uint64_t* bar, unsigned bytes) {
#ifdef DFLASH_CLUSTER_COPY
  asm volatile("mbarrier.arrive.expect_tx.relaxed.cta.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
#else
  (void)bar, (void)bytes;
  __trap();
#endif
}

// An arrival on the barrier at the same place in block `rank` of the cluster (this one included).
__device__ __forceinline__ void mbarrier_arrive_in(uint64_t* bar, unsigned rank) {
#ifdef DFLASH_CLUSTER_COPY
  asm volatile(
      "{\n\t.reg .b32 remote;\n\t"
      "mapa.shared::cluster.u32 remote, %0, %1;\n\t"
      "mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [remote];\n\t}" ::"r"(smem_addr(bar)),
      "r"(rank)
      : "memory");
#else
  (void)bar, (void)rank;
  __trap();
#endif
}

// Until the barrier's phase of parity `parity` has completed. `cluster`: its arrivals came from
// other blocks too, whose earlier accesses this thread must see ordered before its next ones.
template <bool Cluster>
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, unsigned parity) {
#ifdef DFLASH_CLUSTER_COPY
  const uint32_t a = smem_addr(bar);
  uint32_t done = 0;
  while (!done) {
    if constexpr (Cluster)
      asm volatile(
          "{\n\t.reg .pred p;\n\t"
          "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
          "selp.u32 %0, 1, 0, p;\n\t}"
          : "=r"(done)
          : "r"(a), "r"(parity)
          : "memory");
    else
      asm volatile(
          "{\n\t.reg .pred p;\n\t"
          "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
          "selp.u32 %0, 1, 0, p;\n\t}"
          : "=r"(done)
          : "r"(a), "r"(parity)
          : "memory");
  }
#else
  (void)bar, (void)parity;
  __trap();
#endif
}

// A 3-d box of the tensor `map` at `c0, c1, c2`, into `dst` (and the same place) of every block
// in `mask`, each block's barrier at `bar`'s place completing the box's bytes.
__device__ __forceinline__ void tma_load_3d_multicast(void* dst, const CUtensorMap* map, int c0, int c1, int c2,
                                                      uint64_t* bar, uint16_t mask) {
#ifdef DFLASH_CLUSTER_COPY
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar)), "h"(mask)
      : "memory");
#else
  (void)dst, (void)map, (void)c0, (void)c1, (void)c2, (void)bar, (void)mask;
  __trap();
#endif
}

}  // namespace dflash::cuda
