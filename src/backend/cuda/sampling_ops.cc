#include "backend/cuda/sampling_ops.h"

#include <cstring>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/op_args.h"

namespace dflash::cuda {

// Runs `launch` into a device buffer of rows × [count, header…, ids[cap], scaled[cap]] (header
// words: 0 for top-k, the row mass for top-p) and unpacks it: one copy back, one sync.
template <typename Launch>
std::vector<CandidateRow> SamplingOps::candidates_from_device(const char* op, const Tensor& logits, int cap, int header,
                                                              Launch launch) {
  std::vector<CandidateRow> out(size_t(logits.rows));
  const int64_t per_row = header + 2 * int64_t(cap);
  const size_t bytes = size_t(logits.rows * per_row) * sizeof(int32_t);
  auto dev = pool_.allocate(bytes, op);
  OpTimer timer(prof_, op, [&] { return dims(logits.rows, logits.cols); });
  launch(static_cast<int32_t*>(dev.get()));
  const auto* host = reinterpret_cast<const int32_t*>(read_back_.read(dev.get(), bytes, op, &timer));
  for (int64_t r = 0; r < logits.rows; ++r) {
    const int32_t* h = host + r * per_row;
    CandidateRow& row = out[size_t(r)];
    row.count = h[0];
    if (header == 2) {
      float mass;
      std::memcpy(&mass, h + 1, sizeof mass);
      row.row_mass = mass;
    }
    if (row.count > cap) continue;  // too many: the caller reads the row whole
    row.ids.assign(h + header, h + header + row.count);
    row.scaled.resize(size_t(row.count));
    std::memcpy(row.scaled.data(), h + header + cap, size_t(row.count) * sizeof(float));
  }
  return out;
}

std::vector<CandidateRow> SamplingOps::top_k_rows(const Tensor& logits, int k, float inv_t, int max_count) {
  return candidates_from_device("top_k_rows", logits, max_count, 1, [&](int32_t* dev) {
    std::shared_ptr<void> part;
    if (const size_t bytes = cuda::top_k_scratch_bytes(logits.rows, logits.cols, k, max_count))
      part = pool_.allocate(bytes, "top_k_rows");
    cuda::top_k_rows(logits.ptr<float>(), logits.ld, logits.rows, logits.cols, k, inv_t, max_count, dev, part.get(),
                     stream_);
  });
}

std::vector<CandidateRow> SamplingOps::top_p_rows(const Tensor& logits, float inv_t, float top_p, int max_count) {
  return candidates_from_device("top_p_rows", logits, max_count, 2, [&](int32_t* dev) {
    std::shared_ptr<void> part;
    if (const size_t bytes = cuda::top_p_scratch_bytes(logits.rows, logits.cols))
      part = pool_.allocate(bytes, "top_p_rows");
    cuda::top_p_rows(logits.ptr<float>(), logits.ld, logits.rows, logits.cols, inv_t, top_p, max_count, dev, part.get(),
                     stream_);
  });
}

RowLaws SamplingOps::row_laws(const Tensor& logits, float inv_t, const std::vector<int32_t>& ids) {
  expect(logits, DType::F32, "row_laws", "logits");
  Backend::check_row_ids(logits, ids, "row_laws");
  const size_t rows = size_t(logits.rows), n = ids.size();
  RowLaws out;
  if (rows == 0) return out;
  std::vector<int64_t> pairs;
  for (size_t r = 0; r < n; ++r) {
    pairs.push_back(int64_t(r));
    pairs.push_back(ids[r]);
  }
  // One copy in (the pairs) and one back: the laws, two doubles a row, then the scaled logits.
  const size_t law_bytes = 2 * rows * sizeof(double), bytes = law_bytes + n * sizeof(float);
  auto dev = pool_.allocate(bytes, "row_laws");
  auto scratch = pool_.allocate(cuda::row_law_scratch_bytes(logits.rows, logits.cols), "row_laws");
  cuda::row_laws(logits.ptr<float>(), logits.ld, logits.rows, logits.cols, inv_t, static_cast<double*>(dev.get()),
                 scratch.get(), stream_);
  if (n)
    queue_scaled_at(logits, inv_t, pairs, reinterpret_cast<float*>(static_cast<char*>(dev.get()) + law_bytes),
                    "row_laws");
  const char* host = read_back_.read(dev.get(), bytes, "row_laws");
  const auto* law = reinterpret_cast<const double*>(host);
  for (size_t r = 0; r < rows; ++r) out.law.push_back({static_cast<float>(law[2 * r]), law[2 * r + 1]});
  out.scaled.resize(n);
  std::memcpy(out.scaled.data(), host + law_bytes, n * sizeof(float));
  return out;
}

std::vector<float> SamplingOps::scaled_at(const Tensor& logits, float inv_t,
                                          const std::vector<std::pair<int64_t, int32_t>>& at) {
  expect(logits, DType::F32, "scaled_at", "logits");
  std::vector<float> out(at.size());
  if (at.empty()) return out;
  std::vector<int64_t> pairs;
  for (const auto& [r, id] : at) {
    if (r < 0 || r >= logits.rows || id < 0 || id >= logits.cols)
      throw Error("scaled_at: (" + std::to_string(r) + ", " + std::to_string(id) + ") outside " + logits.describe());
    pairs.push_back(r);
    pairs.push_back(id);
  }
  auto dev_out = pool_.allocate(out.size() * sizeof(float), "scaled_at");
  queue_scaled_at(logits, inv_t, pairs, static_cast<float*>(dev_out.get()), "scaled_at");
  read_back_.copy(out.data(), dev_out.get(), out.size() * sizeof(float), "scaled_at");
  return out;
}

std::vector<RowDraw> SamplingOps::draw_from_rows(const Tensor& logits, float inv_t, const std::vector<double>& u,
                                                 const std::vector<RowLaw>& laws) {
  expect(logits, DType::F32, "draw_from_rows", "logits");
  Backend::check_draw_args(logits, u, laws);
  const size_t n = u.size();
  std::vector<RowDraw> out(n);
  if (n == 0) return out;
  // One copy in (the uniforms, and the laws with their cuts where given) and one back: the
  // laws, two doubles a row, then ids, then scaled logits.
  const size_t law_bytes = 2 * n * sizeof(double), bytes = law_bytes + n * (sizeof(int32_t) + sizeof(float));
  const size_t in_bytes = n * sizeof(double) + (laws.empty() ? 0 : law_bytes + n * sizeof(cuda::LawCut));
  std::vector<char> in(in_bytes);
  std::memcpy(in.data(), u.data(), n * sizeof(double));
  for (size_t r = 0; r < laws.size(); ++r) {
    const double law[2] = {laws[r].max, laws[r].mass};
    const cuda::LawCut cut{laws[r].cut, laws[r].cut_id};
    std::memcpy(in.data() + n * sizeof(double) + r * sizeof law, law, sizeof law);
    std::memcpy(in.data() + n * sizeof(double) + law_bytes + r * sizeof cut, &cut, sizeof cut);
  }
  auto dev_in = pool_.allocate(in_bytes, "draw_from_rows");
  auto dev = pool_.allocate(bytes, "draw_from_rows");
  auto scratch = pool_.allocate(cuda::row_law_scratch_bytes(int64_t(n), logits.cols), "draw_from_rows");
  check(cudaMemcpyAsync(dev_in.get(), in.data(), in_bytes, cudaMemcpyHostToDevice, stream_), "draw_from_rows",
        "host to device copy");
  char* base = static_cast<char*>(dev.get());
  char* given = static_cast<char*>(dev_in.get()) + n * sizeof(double);
  auto* ids = reinterpret_cast<int32_t*>(base + law_bytes);
  cuda::draw_from_rows(logits.ptr<float>(), logits.ld, int64_t(n), logits.cols, inv_t,
                       static_cast<const double*>(dev_in.get()), reinterpret_cast<double*>(laws.empty() ? base : given),
                       laws.empty() ? nullptr : reinterpret_cast<const cuda::LawCut*>(given + law_bytes), ids,
                       reinterpret_cast<float*>(ids + n), scratch.get(), stream_);
  const char* host = read_back_.read(dev.get(), bytes, "draw_from_rows");
  const auto* law = reinterpret_cast<const double*>(host);
  for (size_t r = 0; r < n; ++r) {
    out[r].law = laws.empty() ? RowLaw{static_cast<float>(law[2 * r]), law[2 * r + 1]} : laws[r];
    std::memcpy(&out[r].id, host + law_bytes + r * sizeof(int32_t), sizeof(int32_t));
    std::memcpy(&out[r].scaled, host + law_bytes + (n + r) * sizeof(int32_t), sizeof(float));
  }
  return out;
}

std::vector<RowLaw> SamplingOps::top_p_laws(const Tensor& logits, float inv_t, float top_p, float min_p) {
  expect(logits, DType::F32, "top_p_laws", "logits");
  Backend::check_top_p(top_p, min_p, "top_p_laws");
  const size_t rows = size_t(logits.rows);
  std::vector<RowLaw> out(rows);
  if (rows == 0) return out;
  // One copy back: the laws, two doubles a row, then the cuts.
  const size_t law_bytes = 2 * rows * sizeof(double), bytes = law_bytes + rows * sizeof(cuda::LawCut);
  auto dev = pool_.allocate(bytes, "top_p_laws");
  auto scratch = pool_.allocate(cuda::top_p_law_scratch_bytes(logits.rows, logits.cols), "top_p_laws");
  char* base = static_cast<char*>(dev.get());
  cuda::top_p_laws(logits.ptr<float>(), logits.ld, logits.rows, logits.cols, inv_t, top_p, min_p,
                   reinterpret_cast<double*>(base), reinterpret_cast<cuda::LawCut*>(base + law_bytes), scratch.get(),
                   stream_);
  const char* host = read_back_.read(dev.get(), bytes, "top_p_laws");
  for (size_t r = 0; r < rows; ++r) {
    double law[2];
    cuda::LawCut cut;
    std::memcpy(law, host + r * sizeof law, sizeof law);
    std::memcpy(&cut, host + law_bytes + r * sizeof cut, sizeof cut);
    out[r] = RowLaw{static_cast<float>(law[0]), law[1], cut.cut, cut.cut_id};
  }
  return out;
}

int32_t SamplingOps::draw_from_excess(const Tensor& p_logits, int64_t rp, const RowLaw& lp, const Tensor& q_logits,
                                      int64_t rq, const RowLaw& lq, float inv_t, double u) {
  expect(p_logits, DType::F32, "draw_from_excess", "p logits");
  expect(q_logits, DType::F32, "draw_from_excess", "q logits");
  if (p_logits.cols != q_logits.cols || rp < 0 || rp >= p_logits.rows || rq < 0 || rq >= q_logits.rows)
    throw Error("draw_from_excess: row " + std::to_string(rp) + " of " + p_logits.describe() + " against row " +
                std::to_string(rq) + " of " + q_logits.describe());
  auto dev = pool_.allocate(sizeof(int32_t), "draw_from_excess");
  auto scratch = pool_.allocate(cuda::row_law_scratch_bytes(1, p_logits.cols), "draw_from_excess");
  cuda::draw_from_excess(p_logits.ptr<float>() + rp * p_logits.ld, q_logits.ptr<float>() + rq * q_logits.ld,
                         p_logits.cols, inv_t, lp.max, lp.mass, cuda::LawCut{lp.cut, lp.cut_id}, lq.max, lq.mass,
                         cuda::LawCut{lq.cut, lq.cut_id}, u, static_cast<int32_t*>(dev.get()), scratch.get(), stream_);
  int32_t id = -1;
  read_back_.copy(&id, dev.get(), sizeof id, "draw_from_excess");
  return id;
}

// Queues the scaled logits at the flattened (row, id) pairs into dev_out. The pairs' device
// copy may go back to the pool on return: its next user is queued behind this kernel, and a
// copy from pageable memory is staged before cudaMemcpyAsync returns.
void SamplingOps::queue_scaled_at(const Tensor& logits, float inv_t, const std::vector<int64_t>& pairs, float* dev_out,
                                  const char* op) {
  auto dev_at = pool_.allocate(pairs.size() * sizeof(int64_t), op);
  check(cudaMemcpyAsync(dev_at.get(), pairs.data(), pairs.size() * sizeof(int64_t), cudaMemcpyHostToDevice, stream_),
        op, "host to device copy");
  cuda::scaled_at(logits.ptr<float>(), logits.ld, inv_t, static_cast<const int64_t*>(dev_at.get()),
                  static_cast<int>(pairs.size() / 2), dev_out, stream_);
}

void SamplingOps::apply_penalties(Tensor& logits, const PenaltyTokens& t) {
  Backend::check_penalty_tokens(logits, t);
  expect(logits, DType::F32, "apply_penalties", "logits");
  const int64_t rows = int64_t(t.row_first.size()) - 1;
  if (rows == 0) return;
  // One copy in: every_row's entries, the rows' own, then the offsets.
  const size_t n_every = t.every_row.size(), n_own = t.own.size(), entry = sizeof(PenaltyEntry);
  std::vector<char> in((n_every + n_own) * entry + t.row_first.size() * sizeof(int32_t));
  std::memcpy(in.data(), t.every_row.data(), n_every * entry);
  std::memcpy(in.data() + n_every * entry, t.own.data(), n_own * entry);
  std::memcpy(in.data() + (n_every + n_own) * entry, t.row_first.data(), t.row_first.size() * sizeof(int32_t));
  auto dev = pool_.allocate(in.size(), "apply_penalties");
  char* base = static_cast<char*>(dev.get());
  OpTimer timer(prof_, "apply_penalties", [&] { return dims(rows, int64_t(n_every + n_own)); });
  check(cudaMemcpyAsync(base, in.data(), in.size(), cudaMemcpyHostToDevice, stream_), "apply_penalties",
        "host to device copy");
  cuda::apply_penalties(logits.ptr<float>(), logits.ld, rows, reinterpret_cast<const PenaltyEntry*>(base), int(n_every),
                        reinterpret_cast<const PenaltyEntry*>(base + n_every * entry),
                        reinterpret_cast<const int32_t*>(base + (n_every + n_own) * entry), t.repetition, stream_);
}

}  // namespace dflash::cuda
