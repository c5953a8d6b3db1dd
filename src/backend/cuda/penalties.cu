// Backend::apply_penalties on the device: a sampler with penalties then reads its rows as one
// without does (candidates, laws, ids), instead of bringing 600 KB a row to the host. One
// block a row; the entries are the few thousand tokens of a request's history.
#include "backend/backend.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

constexpr int kThreads = 256;

// One penalty over a list (thread t takes entries t, t + kThreads, …), rounded as the host
// rounds it (backend.cc, penalise_row): the intrinsics keep nvcc from fusing x·r − p.
__device__ __forceinline__ void penalise(float* row, const uint32_t* e, int n, uint32_t which, float repetition,
                                         float presence) {
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const uint32_t v = e[i];
    if (!(v & which)) continue;
    float& x = row[v & PenaltyTokens::kId];
    if (which == PenaltyTokens::kRepetition) x = x < 0 ? __fmul_rn(x, repetition) : __fdiv_rn(x, repetition);
    else x = __fsub_rn(x, presence);
  }
}

__global__ void __launch_bounds__(kThreads)
    apply_penalties_kernel(float* x, int64_t ldx, const uint32_t* every_row, int n_every, const uint32_t* own,
                           const int32_t* row_first, float repetition, float presence) {
  grid_dependency_begin();
  float* row = x + blockIdx.x * ldx;
  // A thread's repetition and presence of one entry are in its own program order.
  penalise(row, every_row, n_every, PenaltyTokens::kRepetition, repetition, presence);
  penalise(row, every_row, n_every, PenaltyTokens::kPresence, repetition, presence);
  __syncthreads();  // a row's own entries may penalise further a token another thread did
  const int first = row_first[blockIdx.x], n_own = row_first[blockIdx.x + 1] - first;
  penalise(row, own + first, n_own, PenaltyTokens::kRepetition, repetition, presence);
  penalise(row, own + first, n_own, PenaltyTokens::kPresence, repetition, presence);
}

}  // namespace

void apply_penalties(float* x, int64_t ldx, int64_t rows, const uint32_t* every_row, int n_every, const uint32_t* own,
                     const int32_t* row_first, float repetition, float presence, cudaStream_t s) {
  if (rows == 0) return;
  launch_kernel("apply_penalties", apply_penalties_kernel, static_cast<unsigned>(rows), kThreads, 0, s, x, ldx,
                every_row, n_every, own, row_first, repetition, presence);
}

}  // namespace dflash::cuda
