#pragma once
// The CUDA backend's sampling ops (Backend::top_k_rows, top_p_rows, row_laws, scaled_at,
// draw_from_rows, top_p_laws, draw_from_excess, apply_penalties): each queues its kernels
// (candidates.cu, row_law.cu, penalties.cu) on the backend's stream and brings back only what
// the sampler needs, in one copy and one wait (read_back.h); apply_penalties brings back
// nothing. The backend checks top_k_rows' and top_p_rows' logits and answers their empty cases
// (no rows, k or the cap 0) before calling them; the others check their own.
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/device_pool.h"
#include "backend/cuda/profiler.h"
#include "backend/cuda/read_back.h"

namespace dflash::cuda {

class SamplingOps {
 public:
  SamplingOps(DevicePool& pool, cudaStream_t stream, ReadBack& read_back, OpProfiler* prof)
      : pool_(pool), stream_(stream), read_back_(read_back), prof_(prof) {}

  std::vector<CandidateRow> top_k_rows(const Tensor& logits, int k, float inv_t, int max_count);
  std::vector<CandidateRow> top_p_rows(const Tensor& logits, float inv_t, float top_p, int max_count);
  RowLaws row_laws(const Tensor& logits, float inv_t, const std::vector<int32_t>& ids);
  std::vector<float> scaled_at(const Tensor& logits, float inv_t, const std::vector<std::pair<int64_t, int32_t>>& at);
  std::vector<RowDraw> draw_from_rows(const Tensor& logits, float inv_t, const std::vector<double>& u,
                                      const std::vector<RowLaw>& laws);
  std::vector<RowLaw> top_p_laws(const Tensor& logits, float inv_t, float top_p, float min_p);
  int32_t draw_from_excess(const Tensor& p_logits, int64_t rp, const RowLaw& lp, const Tensor& q_logits, int64_t rq,
                           const RowLaw& lq, float inv_t, double u);
  void apply_penalties(Tensor& logits, const PenaltyTokens& t);

 private:
  template <typename Launch>
  std::vector<CandidateRow> candidates_from_device(const char* op, const Tensor& logits, int cap, int header,
                                                   Launch launch);
  void queue_scaled_at(const Tensor& logits, float inv_t, const std::vector<int64_t>& pairs, float* dev_out,
                       const char* op);

  DevicePool& pool_;
  cudaStream_t stream_;
  ReadBack& read_back_;
  OpProfiler* prof_;  // null unless DFLASH_CUDA_PROFILE=1
};

}  // namespace dflash::cuda
