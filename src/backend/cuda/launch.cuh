#pragma once
// Every kernel of the backend is launched through launch_kernel(): on sm_90 and newer it asks
// for programmatic dependent launch, so the next kernel of a decode step is already resident
// when the current one ends (the few microseconds of launch between two dependent kernels were
// a fifth of a Qwen3-8B step) and can spend the current one's last microseconds prefetching its
// weights into L2. The kernels' side of the contract is grid_dependency_begin()
// (device_util.cuh). DFLASH_CUDA_PDL=0 turns it off, to measure against.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>

#include "backend/cuda/cuda_common.h"

namespace dflash::cuda {

inline bool pdl_enabled() {
  static const bool enabled = [] {
    if (const char* e = std::getenv("DFLASH_CUDA_PDL"); e && std::strcmp(e, "0") == 0) return false;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return enabled;
}

// Measuring only. DFLASH_CUDA_PDL_SKIP="op,op": those ops launch without the attribute (which
// kernel gains or loses by it). DFLASH_CUDA_NOOP="op,op": those ops launch nothing at all, so
// a step's time without them shows what they cost inside it (the results are then wrong).
inline bool op_listed(const char* var, const char* op) {
  static const std::string skip = [] {
    const char* e = std::getenv("DFLASH_CUDA_PDL_SKIP");
    return e ? "," + std::string(e) + "," : std::string();
  }();
  static const std::string noop = [] {
    const char* e = std::getenv("DFLASH_CUDA_NOOP");
    return e ? "," + std::string(e) + "," : std::string();
  }();
  const std::string& list = std::strcmp(var, "DFLASH_CUDA_NOOP") == 0 ? noop : skip;
  return !list.empty() && list.find("," + std::string(op) + ",") != std::string::npos;
}

// DFLASH_CUDA_CARVEOUT=p (0-100, measuring only): every kernel prefers p % of the unified
// L1/shared memory as shared memory, so consecutive kernels never make an SM change its split.
inline void apply_carveout(const void* kernel) {
  static const int pct = [] {
    const char* e = std::getenv("DFLASH_CUDA_CARVEOUT");
    return e ? std::atoi(e) : -1;
  }();
  if (pct < 0) return;
  static std::mutex mu;
  static std::unordered_set<const void*> done;
  std::lock_guard<std::mutex> lock(mu);
  if (done.insert(kernel).second)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, pct), "launch", "carveout");
}

template <typename... Params, typename... Args>
void launch_kernel(const char* op, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   Args&&... args) {
  if (op_listed("DFLASH_CUDA_NOOP", op)) return;
  apply_carveout(reinterpret_cast<const void*>(kernel));
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl_enabled() && !op_listed("DFLASH_CUDA_PDL_SKIP", op) ? 1 : 0;
  check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), op, "kernel launch");
}

}  // namespace dflash::cuda
