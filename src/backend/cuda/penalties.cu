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

// One entry's penalty, rounded as the host rounds it (backend.cc, penalise_row): the
// intrinsics keep nvcc from fusing any two steps (x·r − s).
__device__ __forceinline__ void penalise(float* row, const PenaltyEntry& e, float repetition) {
  float x = row[e.id];
  if (e.bias != 0.f) x = __fadd_rn(x, e.bias);
  if (e.repeated) x = x < 0 ? __fmul_rn(x, repetition) : __fdiv_rn(x, repetition);
  if (e.subtract != 0.f) x = __fsub_rn(x, e.subtract);
  row[e.id] = x;
}

__global__ void __launch_bounds__(kThreads)
    apply_penalties_kernel(float* x, int64_t ldx, const PenaltyEntry* every_row, int n_every, const PenaltyEntry* own,
                           const int32_t* row_first, float repetition) {
  grid_dependency_begin();
  __shared__ int32_t own_ids[PenaltyTokens::kMaxOwn];
  float* row = x + blockIdx.x * ldx;
  const int first = row_first[blockIdx.x], n_own = row_first[blockIdx.x + 1] - first;
  if (threadIdx.x < n_own) own_ids[threadIdx.x] = own[first + threadIdx.x].id;
  __syncthreads();
  // A token with an entry of the row's own takes that one instead: each token once, so no
  // two threads touch one logit.
  for (int i = threadIdx.x; i < n_every; i += kThreads) {
    const PenaltyEntry e = every_row[i];
    bool overridden = false;
    for (int j = 0; j < n_own; ++j) overridden |= own_ids[j] == e.id;
    if (!overridden) penalise(row, e, repetition);
  }
  if (threadIdx.x < n_own) penalise(row, own[first + threadIdx.x], repetition);
}

}  // namespace

void apply_penalties(float* x, int64_t ldx, int64_t rows, const PenaltyEntry* every_row, int n_every,
                     const PenaltyEntry* own, const int32_t* row_first, float repetition, cudaStream_t s) {
  if (rows == 0) return;
  static_assert(PenaltyTokens::kMaxOwn <= kThreads, "a thread for each own entry");
  launch_kernel("apply_penalties", apply_penalties_kernel, static_cast<unsigned>(rows), kThreads, 0, s, x, ldx,
                every_row, n_every, own, row_first, repetition);
}

}  // namespace dflash::cuda
