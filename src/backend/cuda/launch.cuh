#pragma once
// Every kernel of the backend is launched through launch_kernel(): on sm_90 and newer it asks
// for programmatic dependent launch, so the next kernel of a decode step is already resident
// when the current one ends (the few microseconds of launch between two dependent kernels were
// a fifth of a Qwen3-8B step) and can start loading its weights while the current one finishes.
// The kernels' side of the contract is grid_dependency_begin() (device_util.cuh); launch errors
// are checked here. DFLASH_CUDA_PDL=0 turns it off, to measure against.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "backend/cuda/cuda_common.h"
#include "backend/op_list.h"

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

// Measuring only, read once: DFLASH_CUDA_PDL_SKIP="op,op" launches those ops without the
// attribute (which kernel gains or loses by it); DFLASH_CUDA_NOOP="op,op" launches nothing for
// them, so a step's time without them shows what they cost inside it (the results are then
// wrong). `op` is launch_kernel's name for the op; "name*" names every op starting with name
// (op_list.h).
enum class OpList { PdlSkip, NoOp };
inline bool op_listed(OpList which, const char* op) {
  auto read = [](const char* var) {
    const char* e = std::getenv(var);
    return e ? std::string(e) : std::string();
  };
  static const std::string pdl_skip = read("DFLASH_CUDA_PDL_SKIP"), noop = read("DFLASH_CUDA_NOOP");
  return op_in_list(which == OpList::NoOp ? noop : pdl_skip, op);
}

// Measuring only, read once: DFLASH_CUDA_CARVEOUT="op=N;op=N" asks, for those ops' kernels, for N
// percent of the SM's unified L1 / shared memory as shared memory
// (cudaFuncAttributePreferredSharedMemoryCarveout, a hint; −1 the driver's choice), instead of
// the backend's own choice (none for most kernels). Empty where the op is not listed.
inline std::optional<int> carveout_for(const char* op) {
  static const std::map<std::string, int> table = [] {
    std::map<std::string, int> t;
    const char* e = std::getenv("DFLASH_CUDA_CARVEOUT");
    std::string list = e ? e : "";
    for (size_t start = 0; start < list.size();) {
      const size_t end = std::min(list.find(';', start), list.size());
      const std::string item = list.substr(start, end - start);
      if (const size_t eq = item.rfind('='); eq != std::string::npos)
        t[item.substr(0, eq)] = std::atoi(item.c_str() + eq + 1);
      start = end + 1;
    }
    return t;
  }();
  const auto it = table.find(op);
  return it == table.end() ? std::nullopt : std::optional<int>(it->second);
}
inline void apply_carveout(const void* kernel, int percent, const char* op) {
  static std::mutex mutex;
  static std::set<const void*> done;  // set once per kernel
  std::lock_guard<std::mutex> lock(mutex);
  if (done.insert(kernel).second)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent), op,
          "cudaFuncSetAttribute (carveout)");
}

// Kernel's own carveout (percent), set on its first launch, unless DFLASH_CUDA_CARVEOUT names
// `op` (launch_kernel then sets that one). Once per kernel without a lock on later launches.
template <auto Kernel>
void default_carveout(int percent, const char* op) {
  static const bool set = [&] {
    if (!carveout_for(op)) apply_carveout(reinterpret_cast<const void*>(Kernel), percent, op);
    return true;
  }();
  (void)set;
}

template <typename... Params, typename... Args>
void launch_kernel(const char* op, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                   Args&&... args) {
  if (op_listed(OpList::NoOp, op)) return;
  if (const std::optional<int> c = carveout_for(op)) apply_carveout(reinterpret_cast<const void*>(kernel), *c, op);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl_enabled() && !op_listed(OpList::PdlSkip, op) ? 1 : 0;
  check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), op, "kernel launch");
}

}  // namespace dflash::cuda
