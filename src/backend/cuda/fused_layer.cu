// A whole attention + MLP decoder layer for decode, verification and drafting rows (M ≤ 16) as
// one resident kernel: the seven launches of the layer (q/k/v product, q/k-norm + RoPE + cache
// store, split attention, merge, o_proj, gate/up, down) become seven stages of one cooperative
// kernel, separated by grid barriers instead of kernel boundaries. `dflash doctor` measured why
// (sync_cost.cu, H200): a dependency costs 2.45-2.72 µs as a boundary under PDL and 1.12-1.40 µs
// as a barrier, and the short stages between the products were what kept plain decode below
// 85 % of the bandwidth bound (docs/cuda.md, What remains).
//
// Each stage runs the very block bodies the separate kernels run (skinny_mma.cuh,
// qk_norm_rope.cuh, attention_split.cuh) on "virtual blocks": block b of the stage is taken by
// resident block b mod gridDim, with the same tiling, K slices and order, so every number keeps
// its bits and a layer run fused equals the same layer run op by op (a GPU test checks it).
// A product issues its first weight batch before the barrier it waits at, as it does before
// its grid dependency wait under PDL: weights are never written, so they may be in flight
// while the stage before ends. Activations written by an earlier stage are read with plain
// (coherent) loads, never through the read-only path.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/attention_split.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/qk_norm_rope.cuh"
#include "backend/cuda/skinny_mma.cuh"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 256;  // the products' and the split blocks' 8 warps
constexpr int kBarriers = 6;   // between the seven stages
// The largest product buffer (an emitting product of two n8 tiles a warp).
constexpr size_t kProductSmemBytes =
    sizeof(float) * size_t(skinny::skinny_smem_floats<1, 2, skinny::kEpiEmitNorm, false>());

__device__ __forceinline__ unsigned load_acquire_gpu(const unsigned* p) {
  unsigned v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
  v = *reinterpret_cast<const volatile unsigned*>(p);
  __threadfence();
#endif
  return v;
}

// A grid barrier on a counter that only grows. The launches sharing a counter run in stream
// order (one stream, and each waits for the one before at its first stage), so launch n starts
// with the counter at `base`, the arrivals of every launch before it, which the host keeps;
// barrier i of the launch is passed once the counter reaches base + i · gridDim.x (in modular
// arithmetic, so it may wrap).
struct GridBarrier {
  unsigned* counter;
  unsigned base;
  int passed = 0;
  __device__ __forceinline__ void sync() {
    __syncthreads();
    ++passed;
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
      const unsigned target = base + unsigned(passed) * gridDim.x;
      while (static_cast<int>(load_acquire_gpu(counter) - target) < 0) {
      }
      __threadfence();
    }
    __syncthreads();
  }
};

// One stage: virtual blocks blockIdx.x, blockIdx.x + gridDim.x, … of `units`. `sync` (the wait
// for the stage before) runs once in every block, at the point the body asks for it (after its
// first weight loads), or at the end for a block with nothing to do.
template <typename Body, typename Sync>
__device__ __forceinline__ void run_stage(int units, Body&& body, Sync&& sync) {
  bool synced = false;
  auto wait = [&] {
    if (!synced) {
      sync();
      synced = true;
    }
  };
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    if (u != static_cast<int>(blockIdx.x)) __syncthreads();  // the last unit's shared memory is free again
    body(u, wait);
  }
  wait();
}

// The products, in kernel order.
enum Product { kQkv = 0, kO = 1, kGateUp = 2, kDown = 3 };

struct FusedLayerParams {
  skinny::SkinnyMmaArgs prod[4];  // with epi, pair and y_f32 set (kEpiRuntime)
  int prod_blocks[4];
  qk_norm::QkNormRopeArgs qk;
  int qk_units;
  split_kv::SplitArgs attn;
  int attn_x, attn_y, attn_z, merge_v;
  unsigned* barrier;
  unsigned barrier_base;
  int skip;  // measuring only (DFLASH_FUSED_SKIP): stages left out, bit i for stage i in kernel order
};

__device__ __forceinline__ void qk_norm_stage(const qk_norm::QkNormRopeArgs& a, int units, GridBarrier& bar) {
  run_stage(units, [&](int u, auto& wait) {
    wait();
    qk_norm::qk_norm_rope_store_block(a, u);
  }, [&] { bar.sync(); });
}

__device__ __forceinline__ void attention_stage(const split_kv::SplitArgs& a, int gx, int gy, int gz,
                                                unsigned char* smem, GridBarrier& bar) {
  run_stage(gx * gy * gz, [&](int u, auto& wait) {
    split_kv::split_block<8>(a, smem, u % gx, (u / gx) % gy, u / (gx * gy), wait);
  }, [&] { bar.sync(); });
}

// A warp per (row, head), with 4 chunks' outputs loaded ahead instead of 16: those take a
// thread's registers, and beside the products they made them spill (ptxas).
template <int V, int EARLY = 4>
__device__ __forceinline__ void merge_stage(const split_kv::SplitArgs& a, GridBarrier& bar) {
  bar.sync();
  constexpr int kWarpsPerBlock = kThreads / 32;
  const int64_t pairs = a.T * a.hq;
  for (int64_t pair = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; pair < pairs;
       pair += int64_t(gridDim.x) * kWarpsPerBlock)
    split_kv::merge_pair<V, EARLY>(a, pair);
}
// Measuring only: the merge as a call of its own, with all 16 chunks ahead.
template <int V>
__device__ __noinline__ void merge_stage_call(const split_kv::SplitArgs& a, GridBarrier& bar) {
  merge_stage<V, split_kv::kMergeEarlyChunks>(a, bar);
}

// The whole layer. The four products share one copy of the product code, walked in a loop
// that is not unrolled: with a copy per product (or per product kind) in one kernel, ptxas
// kept values of one alive across another and spilled the weight batches in flight to local
// memory (2026-11-30: the layer ran at half the products' speed). NT: the products' n8 tiles
// a warp, the same for all four (the host checks).
template <int NT, int XU = 4, bool MERGE_CALL = false>
__global__ void __launch_bounds__(kThreads, 2) fused_layer_kernel(const __grid_constant__ FusedLayerParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  // The products' arguments, picked by a run-time index below: from shared memory, where the
  // index costs nothing (a parameter indexed at run time is copied to local memory first).
  __shared__ skinny::SkinnyMmaArgs prod[4];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) prod[i] = p.prod[i];
  }
  __syncthreads();
  float* sbuf = reinterpret_cast<float*>(smem);
  GridBarrier bar{p.barrier, p.barrier_base};
#pragma unroll 1
  for (int stage = 0; stage < 7; ++stage) {
    const bool skip = p.skip >> stage & 1;
    if (stage == 1) {  // per (row, head): q/k-norm and RoPE, k and v into the cache
      qk_norm_stage(p.qk, skip ? 0 : p.qk_units, bar);
    } else if (stage == 2) {  // split attention over the cache, chunk by chunk
      attention_stage(p.attn, p.attn_x, p.attn_y, skip ? 0 : p.attn_z, smem, bar);
    } else if (stage == 3) {
      if (skip) bar.sync();
      else if (MERGE_CALL && p.merge_v == 4) merge_stage_call<4>(p.attn, bar);
      else if (MERGE_CALL) merge_stage_call<1>(p.attn, bar);
      else if (p.merge_v == 4) merge_stage<4>(p.attn, bar);
      else merge_stage<1>(p.attn, bar);
    } else {
      // q/k/v (the input norm consumed, after the kernel before this one); x += attn·o_projᵀ
      // emitting the post-attention norm; act = silu(gate)·up consuming it; x += act·downᵀ
      // emitting the next layer's input norm.
      const int i = stage == 0 ? kQkv : stage - 3;
      const skinny::SkinnyMmaArgs& a = prod[i];
      run_stage(skip ? 0 : p.prod_blocks[i], [&](int b, auto& wait) {
        skinny::skinny_mma_block<1, NT, void, skinny::kEpiRuntime, false, false, XU>(a, b, sbuf, wait);
      }, [&] {
        if (stage == 0) grid_dependency_begin();
        else bar.sync();
      });
    }
  }
}

// The layer's attention half only: the q/k/v product, then q/k-norm, split attention and the
// merge; o_proj, gate/up and down follow as kernels of their own.
template <int NT>
__global__ void __launch_bounds__(kThreads, 2) fused_attention_kernel(const __grid_constant__ FusedLayerParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* sbuf = reinterpret_cast<float*>(smem);
  GridBarrier bar{p.barrier, p.barrier_base};
  run_stage(p.prod_blocks[kQkv], [&](int b, auto& wait) {
    skinny::skinny_mma_block<1, NT, __nv_bfloat16, skinny::kEpiScaleInv, false, true>(p.prod[kQkv], b, sbuf, wait);
  }, [] { grid_dependency_begin(); });
  qk_norm_stage(p.qk, p.qk_units, bar);
  attention_stage(p.attn, p.attn_x, p.attn_y, p.attn_z, smem, bar);
  if (p.merge_v == 4) merge_stage<4, split_kv::kMergeEarlyChunks>(p.attn, bar);
  else merge_stage<1, split_kv::kMergeEarlyChunks>(p.attn, bar);
}

// What runs as one kernel (DFLASH_FUSED_LAYER, read once): "attention" (the default) the
// attention half, "full" the whole layer, "0" nothing (the launch-per-op path), to measure.
enum class FusedMode { Off, Attention, Full };
FusedMode fused_mode() {
  static const FusedMode mode = [] {
    const char* e = std::getenv("DFLASH_FUSED_LAYER");
    const std::string v = e ? e : "";
    return v == "0" ? FusedMode::Off : v == "full" ? FusedMode::Full : FusedMode::Attention;
  }();
  return mode;
}

struct LaunchShape {
  int sms = 0;
  bool cooperative = false;
};
const LaunchShape& launch_shape() {
  static const LaunchShape shape = [] {
    LaunchShape s;
    int device = 0, coop = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&s.sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return s;
    }
    s.cooperative = coop != 0;
    // The split stage's largest tile decides the dynamic shared memory a launch may ask for.
    for (auto* k : {fused_layer_kernel<1>, fused_layer_kernel<2>, fused_layer_kernel<2, 2>, fused_layer_kernel<2, 2, true>,
                    fused_attention_kernel<1>, fused_attention_kernel<2>})
      if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(std::max(split_kv::split_smem_max(), kProductSmemBytes))) !=
          cudaSuccess) {
        (void)cudaGetLastError();
        s.cooperative = false;
      }
    return s;
  }();
  return shape;
}

}  // namespace

bool fused_layer(const FusedLayerIo& io, unsigned* barrier, unsigned& barrier_arrivals, cudaStream_t s) {
  const FusedMode mode = fused_mode();
  if (mode == FusedMode::Off || io.M < 1 || io.M > kFusedLayerMaxRows || io.head_dim > split_kv::kMaxHeadDim ||
      io.head_dim % 2 || io.head_dim > 512)
    return false;
  const LaunchShape& shape = launch_shape();
  if (!shape.cooperative) return false;
  const int M = io.M, H = io.hidden, D = io.head_dim, hq = io.q_heads, hkv = io.kv_heads, I = io.intermediate;
  const int q_cols = hq * D, kv_cols = hkv * D;

  FusedLayerParams p{};
  SkinnyNorm consume_in;
  consume_in.partial_in = io.partial_in;
  consume_in.ld_partial = io.ld_partial_in;
  consume_in.parts = io.parts_in;
  consume_in.eps = io.eps;
  const skinny::MmaPlan qkv = skinny::plan_mma(io.h, io.ldh, io.w_qkv, io.ld_w_qkv, io.qkv, io.ld_qkv, M,
                                               q_cols + 2 * kv_cols, H, false, true, &consume_in, false);
  SkinnyNorm emit_mid;
  emit_mid.norm_w = io.post_norm;
  emit_mid.h = static_cast<__nv_bfloat16*>(io.h);
  emit_mid.ldh = io.ldh;
  emit_mid.partial_out = io.partial_mid;
  emit_mid.ld_partial = io.ld_partial_mid;
  const skinny::MmaPlan o = skinny::plan_mma(io.attn, io.ld_attn, io.w_o, io.ld_w_o, io.x, io.ldx, M, H, q_cols,
                                             true, true, &emit_mid, false);
  SkinnyNorm consume_mid;
  consume_mid.partial_in = io.partial_mid;
  consume_mid.ld_partial = io.ld_partial_mid;
  consume_mid.parts = skinny_norm_parts(H, q_cols);
  consume_mid.eps = io.eps;
  const skinny::MmaPlan gate_up = skinny::plan_mma(io.h, io.ldh, io.w_gate_up, io.ld_w_gate_up, io.act, io.ld_act,
                                                   M, 2 * I, H, false, true, &consume_mid, true);
  SkinnyNorm emit_out;
  emit_out.norm_w = io.next_norm;
  emit_out.h = static_cast<__nv_bfloat16*>(io.h);
  emit_out.ldh = io.ldh;
  emit_out.partial_out = io.partial_out;
  emit_out.ld_partial = io.ld_partial_out;
  const skinny::MmaPlan down = skinny::plan_mma(io.act, io.ld_act, io.w_down, io.ld_w_down, io.x, io.ldx, M, H, I,
                                                true, true, &emit_out, false);
  if (!qkv.ok || !o.ok || !gate_up.ok || !down.ok) return false;

  const auto* qkv_out = static_cast<__nv_bfloat16*>(io.qkv);
  const split_kv::SplitPlan attn =
      split_kv::plan_split(qkv_out, io.ld_qkv, io.k_cache, io.ld_k_cache, io.v_cache, io.ld_v_cache, io.attn,
                           io.ld_attn, M, hq, hkv, D, io.kv_len, io.q_pos0, io.causal, io.attn_scratch);
  if (attn.a.nc == 0 || !attn.a.mma) return false;  // the launch-per-op path covers the rest

  const skinny::MmaPlan* plans[4] = {&qkv, &o, &gate_up, &down};
  for (int i = 0; i < 4; ++i) {
    p.prod[i] = plans[i]->args;
    p.prod_blocks[i] = plans[i]->blocks;
  }
  p.qk = qk_norm::QkNormRopeArgs{static_cast<__nv_bfloat16*>(io.qkv), io.ld_qkv, hq, qkv_out + q_cols, io.ld_qkv,
                                 qkv_out + q_cols + kv_cols, io.ld_qkv, hkv, io.q_norm, io.k_norm, io.eps, D,
                                 io.positions, io.q_pos0, io.cos, io.sin,
                                 static_cast<__nv_bfloat16*>(io.k_cache) + io.kv_pos0 * io.ld_k_cache, io.ld_k_cache,
                                 static_cast<__nv_bfloat16*>(io.v_cache) + io.kv_pos0 * io.ld_v_cache, io.ld_v_cache};
  p.qk_units = M * (hq + 2 * hkv);
  p.attn = attn.a;
  p.attn_x = static_cast<int>(attn.grid.x);
  p.attn_y = static_cast<int>(attn.grid.y);
  p.attn_z = static_cast<int>(attn.grid.z);
  p.merge_v = attn.merge_v;
  p.barrier = barrier;
  p.barrier_base = barrier_arrivals;
  static const int skip = [] {
    const char* e = std::getenv("DFLASH_FUSED_SKIP");
    return e ? std::atoi(e) : 0;
  }();
  p.skip = skip;

  const size_t smem = std::max(attn.smem, kProductSmemBytes);
  // The whole layer needs one tile width for its four products (one copy of their code).
  const bool full = mode == FusedMode::Full && qkv.NT == o.NT && o.NT == gate_up.NT && gate_up.NT == down.NT;
  static const int variant = [] {  // measuring only
    const char* e = std::getenv("DFLASH_FUSED_VARIANT");
    return e ? std::atoi(e) : 0;
  }();
  auto* layer2 = variant == 1 ? fused_layer_kernel<2, 2> : variant == 2 ? fused_layer_kernel<2, 2, true>
                                                                        : fused_layer_kernel<2>;
  auto* kernel = full ? (qkv.NT == 2 ? layer2 : fused_layer_kernel<1>)
                      : (qkv.NT == 2 ? fused_attention_kernel<2> : fused_attention_kernel<1>);
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem) !=
          cudaSuccess || per_sm < 1) {
    (void)cudaGetLastError();
    return false;
  }
  const unsigned blocks = static_cast<unsigned>(shape.sms * std::min(per_sm, 2));
  if (op_listed(OpList::NoOp, "fused_layer")) return true;

  // Cooperative: the driver refuses a grid that could not be resident at once (a block spinning
  // at a barrier for one never scheduled would hang). Under PDL as well where the driver allows
  // the pair; the first launch finds out.
  static int pdl_with_coop = -1;  // unknown, 0 no, 1 yes
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeCooperative;
  attrs[0].val.cooperative = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = blocks;
  cfg.blockDim = kThreads;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attrs;
  const bool pdl = pdl_enabled() && pdl_with_coop != 0;
  cfg.numAttrs = pdl ? 2 : 1;
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, p);
  if (pdl && pdl_with_coop < 0) {
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      cfg.numAttrs = 1;
      e = cudaLaunchKernelEx(&cfg, kernel, p);
    }
    pdl_with_coop = cfg.numAttrs == 2 ? 1 : 0;
  }
  check(e, "fused_layer", "cooperative kernel launch");
  barrier_arrivals += unsigned(full ? kBarriers : 3) * blocks;
  if (!full) {
    skinny_matmul(io.attn, io.ld_attn, io.w_o, io.ld_w_o, io.x, io.ldx, Elem::F32, M, H, q_cols, true, true, s,
                  &emit_mid);
    skinny_matmul_silu_mul(io.h, io.ldh, io.w_gate_up, io.ld_w_gate_up, io.act, io.ld_act, M, 2 * I, H, true, s,
                           &consume_mid);
    skinny_matmul(io.act, io.ld_act, io.w_down, io.ld_w_down, io.x, io.ldx, Elem::F32, M, H, I, true, true, s,
                  &emit_out);
  }
  return true;
}

}  // namespace dflash::cuda
