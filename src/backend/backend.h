#pragma once
// The seam between models and devices. Models are written once against this interface; the
// CPU implementation (backend/cpu) and the CUDA one (backend/cuda) supply the ops. Every op
// works on 2-D views (see tensor.h); "per head" ops take the head size.
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/tensor.h"
#include "io/safetensors.h"
#include "model/rope.h"

namespace dflash {

enum class AttentionMask {
  Causal,  // query t (at position pos0 + t) sees keys 0 … pos0 + t
  None,    // every query sees every key (the drafter's block)
};

// rms_norm(x; norm_w) over whole rows, as the input of the products after it (Backend's
// norm_rows, matmul_add_norm and the *_normed products). A backend may keep it deferred: the
// CUDA backend stores bf16(norm_w ⊙ x) and per-row partial sums of x², and the consuming
// product scales each row's sums by its 1/rms, so the norm needs no launch between two
// products. x must stay unchanged until the norm is consumed (a backend may recompute from it).
struct NormedRows {
  Tensor h;        // [rows, cols], the activation dtype: the normalised rows, or bf16(norm_w ⊙ x)
  Tensor partial;  // deferred only: f32 [rows, parts], partial sums of x² over column ranges
  Tensor x, norm_w;
  float eps = 0.f;
  bool deferred = false;

  NormedRows slice_rows(int64_t begin, int64_t count) const {
    NormedRows r = *this;
    r.h = h.slice_rows(begin, count);
    r.x = x.slice_rows(begin, count);
    if (deferred) r.partial = partial.slice_rows(begin, count);
    return r;
  }
};

// One row's sampling candidates (Backend::top_k_rows, top_p_rows).
struct CandidateRow {
  int count = 0;                // candidates, ties included
  std::vector<int32_t> ids;     // ascending; empty when count exceeded the caller's max_count
  std::vector<float> scaled;    // logit · inv_t of each id
  // top_p_rows only: Σ exp(scaled − the row's largest scaled) over the whole row, the softmax's
  // denominator; 0 when the candidates are all the row's possible tokens (top-k).
  double row_mass = 0;
};
// The rule: scaled = row[i] · inv_t in f32; the k-th largest scaled value (counting repeats)
// is the threshold; every i with scaled ≥ threshold survives (NaN never does).
void select_top_k(const float* row, int n, int k, float inv_t, CandidateRow& out);
// Top-p's candidates, a superset of the nucleus: with m the largest scaled value, each token
// falls in bucket ⌊(m − scaled)·kTopPBucketsPerUnit⌋ (the last bucket takes every token further
// down, NaN none); the candidates are the fewest leading buckets such that the buckets left out
// hold at most (1 − top_p)·(1 − 1e-3) of the row's mass Σ exp(scaled − m). Every token left out
// then has at most that mass at or below it, so top-p drops it; the 1e-3 covers the rounding of
// the mass, which the device sums in another order.
constexpr int kTopPBuckets = 2048;
constexpr float kTopPBucketsPerUnit = 32.f;
void select_top_p(const float* row, int n, float inv_t, float top_p, CandidateRow& out);

// A whole row's softmax where the row is (Backend::row_laws), for rows no candidate set is
// smaller than (temperature alone, or a top-p nucleus too large to move: Backend::top_p_laws):
// p_i = exp(scaled_i − max) / mass for the tokens the law admits, 0 for the others, scaled =
// logit · inv_t. A top-p law admits the tokens ranked at or above its cut in the order
// (scaled, id); temperature alone admits every token (the cut is −inf, and a −inf or NaN token
// weighs 0 anyway).
struct RowLaw {
  float max = 0.f;
  double mass = 0.0;
  float cut = -INFINITY;
  int32_t cut_id = 0;  // of the tokens whose scaled logit equals cut, those with id ≥ cut_id
  bool admits(float scaled, int32_t id) const { return scaled > cut || (scaled == cut && id >= cut_id); }
};
struct RowLaws {
  std::vector<RowLaw> law;    // a row each
  std::vector<float> scaled;  // scaled[r]: the scaled logit at the id asked for in row r
};
struct RowDraw {
  int32_t id = -1;
  float scaled = 0.f;  // the drawn id's scaled logit
  RowLaw law;          // the row's law, which the draw computed first
};

// Penalties for rows of logits that stay where they are (Backend::apply_penalties): token ids,
// each with what it takes: x + bias, then the repetition penalty where `repeated` (y < 0 ?
// y · repetition : y / repetition), then − subtract, each step rounded (apply_penalties in
// engine/sampling.cc, term for term; bias is the request's logit bias, subtract its frequency
// and presence penalties). `every_row`'s apply to each row, except where
// the row has its own entry for the token, own[row_first[r] … row_first[r + 1]): then that one,
// which is the token's whole penalty for the row (a drafted block's rows see one more token
// each). engine/sampling.h's PenaltyHistory builds them. Each id at most once in each list.
struct PenaltyEntry {
  int32_t id = 0;
  uint32_t repeated = 0;  // 1: the repetition penalty applies
  float subtract = 0.f;
  float bias = 0.f;
};
struct PenaltyTokens {
  std::vector<PenaltyEntry> every_row;
  std::vector<PenaltyEntry> own;
  std::vector<int32_t> row_first;  // rows + 1 offsets into own
  float repetition = 1.f;
  static constexpr int kMaxOwn = 64;  // own entries a row may have
};

// Token ids on their way back to the host (Backend::read_ids): get() waits for them.
class PendingIds {
 public:
  virtual ~PendingIds() = default;
  virtual std::vector<int32_t> get() = 0;
};

// A point in the order of queued work (Backend::mark).
class QueueMark {
 public:
  virtual ~QueueMark() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual DeviceKind device() const = 0;
  // The dtype activations and caches are kept in (F32 on the CPU, BF16 on the GPU).
  virtual DType activation_dtype() const = 0;

  virtual Tensor alloc(int64_t rows, int64_t cols, DType dtype) = 0;
  // A weight in the backend's compute format. Several tensors are concatenated along rows
  // (fused q/k/v and gate/up projections).
  virtual Tensor upload_weight(const std::vector<const TensorInfo*>& parts) = 0;
  virtual Tensor upload(const float* host, int64_t rows, int64_t cols) = 0;
  virtual void download(const Tensor& t, float* host) = 0;  // rows × cols, packed

  // y = x · wᵀ, or y += x · wᵀ when accumulate.  x [M, K], w [N, K], y [M, N]; y is in the
  // activation dtype, or F32 (logits) on any backend.
  virtual void matmul(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate = false) = 0;
  // Each group of `group` consecutive elements of a row is RMS-normalised and scaled by w[group].
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, int64_t group, Tensor& y) = 0;
  // Rotates each head of x in place (rotate-half convention) at the given positions.
  virtual void rope(Tensor& x, const std::vector<int32_t>& positions, int64_t head_dim,
                    const RopeTable& table) = 0;
  // out[t] = softmax(q[t]·kᵀ · head_dim^-0.5) · v over keys 0 … kv_len − 1, with GQA.
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t kv_len,
                         int64_t q_pos0, int64_t head_dim, AttentionMask mask, Tensor& out) = 0;
  // gate_up [T, 2I] (gate then up) → out [T, I] = silu(gate) * up.
  virtual void silu_mul(const Tensor& gate_up, Tensor& out) = 0;
  virtual void embed(const std::vector<int32_t>& ids, const Tensor& table, Tensor& out) = 0;
  virtual void copy(const Tensor& src, Tensor& dst) = 0;  // same shape, any strides
  virtual void add(const Tensor& x, Tensor& y) = 0;       // y += x
  virtual std::vector<int32_t> argmax_rows(const Tensor& x) = 0;
  // Top-k sampling's survivors of each F32 row, so that only they leave the device: the ids
  // (ascending) and scaled logits (logit · inv_t, rounded to f32) of every token whose scaled
  // logit reaches the row's k-th largest, ties included (select_top_k below is the rule). A row
  // with more than max_count survivors (ties) comes back with count set and ids empty; the
  // caller then reads that row whole. The default downloads the rows and runs select_top_k.
  virtual std::vector<CandidateRow> top_k_rows(const Tensor& logits, int k, float inv_t, int max_count);
  // Top-p's candidates of each F32 row (select_top_p is the rule) with the row's mass, so that
  // top-p without top-k moves the nucleus and a few more tokens instead of the row; overflow as
  // in top_k_rows. The default downloads the rows and runs select_top_p.
  virtual std::vector<CandidateRow> top_p_rows(const Tensor& logits, float inv_t, float top_p, int max_count);
  // Sampling from whole rows without moving them, each op one trip to the device:
  // - row_laws: each row's law (its max scaled logit, NaN skipped, and mass Σ exp(scaled − max)
  //   in f64), and the scaled logit at ids[r] of each row r < ids.size() (a verification's p(d));
  // - scaled_at: the scaled logit at (row, id) pairs;
  // - draw_from_rows: one draw from each of rows 0 … u.size() − 1 under its law, row r with the
  //   uniform u[r]: the first id at which Σ_{j ≤ id} exp(scaled_j − max) exceeds u times the
  //   whole sum (both summed by the draw, in one order, over the tokens the law admits), with
  //   the scaled logit there and the row's law (a step's drafts and their q(d) in one call).
  //   The laws are laws[r] where given (top_p_laws'), otherwise each row's whole softmax, which
  //   the draw works out first;
  // - draw_from_excess: a draw from normalise(max(0, p − q)), p row rp of p_logits and q row rq
  //   of q_logits with their laws (each admitting its own tokens), likewise.
  // A draw from nothing (every weight 0) is id −1. The defaults download the rows and work on
  // the host.
  virtual RowLaws row_laws(const Tensor& logits, float inv_t, const std::vector<int32_t>& ids);
  // row_laws' argument check, shared by every backend: at most a row of ids a row, each an id of
  // the vocabulary; the error names the op, the id and the logits.
  static void check_row_ids(const Tensor& logits, const std::vector<int32_t>& ids, const char* op);
  virtual std::vector<float> scaled_at(const Tensor& logits, float inv_t,
                                       const std::vector<std::pair<int64_t, int32_t>>& at);
  virtual std::vector<RowDraw> draw_from_rows(const Tensor& logits, float inv_t, const std::vector<double>& u,
                                              const std::vector<RowLaw>& laws);
  // Each row's top-p (and min-p) law, for rows whose nucleus is too large for top_p_rows to
  // move: the tokens in ascending order of (scaled, id) lose the longest prefix whose
  // probability stays at or below 1 − top_p (the rule apply_top_p states, engine/sampling.cc;
  // top_p 1: none), then min-p drops every token whose weight is below min_p of the largest
  // (min_p_cut, top_p_fixed.h; 0: none), and the law is the softmax of what is left. The prefix
  // is found on weights fixed to multiples of 2^-40 of the largest (integers, so the sums are
  // exact in any order and every backend finds the same cut); the law's mass is then the f64
  // sum of the admitted weights. A row with nothing finite gets mass 0 (its draws are −1).
  virtual std::vector<RowLaw> top_p_laws(const Tensor& logits, float inv_t, float top_p, float min_p);
  // The argument checks of draw_from_rows and top_p_laws, shared by every backend.
  static void check_draw_args(const Tensor& logits, const std::vector<double>& u, const std::vector<RowLaw>& laws);
  static void check_top_p(float top_p, float min_p, const char* op);
  virtual int32_t draw_from_excess(const Tensor& p_logits, int64_t rp, const RowLaw& lp, const Tensor& q_logits,
                                   int64_t rq, const RowLaw& lq, float inv_t, double u);

  // Penalises rows 0 … t.row_first.size() − 2 of F32 logits in place (PenaltyTokens), so that
  // a sampler with penalties can read the rows in any form it reads unpenalised ones.
  virtual void apply_penalties(Tensor& logits, const PenaltyTokens& t) = 0;
  // apply_penalties' argument check, shared by every backend: the error names the entry.
  static void check_penalty_tokens(const Tensor& logits, const PenaltyTokens& t);
  // apply_penalties of one row where it is in host memory.
  static void penalise_row(float* row, int64_t r, const PenaltyTokens& t);

  // Steps queued ahead of the host (the engine's greedy loops): token ids stay where the
  // backend keeps them between one pass's choice and the next pass's embedding, so the host can
  // queue a step before it has read the result of the step ahead of it.
  //
  // ids (I32 [x.rows, 1], from alloc) ← each row's argmax, as argmax_rows, without waiting.
  virtual void argmax_rows_into(const Tensor& x, Tensor& ids);
  // embed() with ids (I32 [rows, 1]) where they are. The host cannot check ids it never sees:
  // they must be rows of the table (argmax_rows_into over logits of the table's vocabulary).
  virtual void embed_rows(const Tensor& ids, const Tensor& table, Tensor& out);
  // Starts bringing ids (I32 [rows, 1]) back, as they will be once the ops queued so far ran.
  virtual std::unique_ptr<PendingIds> read_ids(const Tensor& ids);
  // Queues ids ← v (I32 [v.size(), 1]).
  virtual void write_ids(const std::vector<int32_t>& v, Tensor& ids);
  // Timing queued work without waiting between its parts: the seconds between two marks,
  // as the device ran it (waits until `to` is reached). The default: the host clock at mark().
  virtual std::unique_ptr<QueueMark> mark();
  virtual double seconds_between(const QueueMark& from, const QueueMark& to);
  // Queues the ops step() queues. A backend may record them and launch the recording as one
  // unit (CUDA: a graph, kept per key and updated from each new recording, so a key should
  // name steps of one shape). step() must not read results back. The default runs it. A
  // recording starts to run only once it is complete, so it pays where the device is busy with
  // earlier work while the host records. `started` (may be null) receives a mark placed right
  // before the recording on the queue: the device reaches it once the earlier work is done and
  // the recording is queued, so from a mark before it to `started` is what the device waited
  // for the host (engine/recording_rule.h).
  virtual void queue_recorded(const std::string& key, const std::function<void()>& step,
                              std::unique_ptr<QueueMark>* started);
  // Whether queue_recorded records (false: it just runs the step, as the default does).
  virtual bool records_steps() const { return false; }
  // Whether queued ops run while the host goes on (CUDA: a stream). Where they do, work queued
  // before a read runs while the host waits for it and then decides; where they do not
  // (the CPU), each op has run when its call returns.
  virtual bool runs_ahead() const { return false; }

  // Fused steps of a decoder layer. The defaults (backend.cc) compose the ops above; a backend
  // overrides one where a single kernel saves launches and passes over memory. An override
  // must still give each row the same bits whatever the number of rows (docs/cuda.md).
  //
  // out = rms_norm(x; norm_w, eps) as a product's input; out.h is allocated by the caller
  // ([x.rows, x.cols], activation dtype), the rest by the backend.
  virtual void norm_rows(const Tensor& x, const Tensor& norm_w, float eps, NormedRows& out);
  // A pass's first steps: x ← the table's rows (embed, or embed_rows for ids where the backend
  // keeps them), then norm_rows(x, norm_w, eps, out). One launch where a backend fuses them.
  virtual void embed_normed(const std::vector<int32_t>& ids, const Tensor& table, Tensor& x, const Tensor& norm_w,
                            float eps, NormedRows& out);
  virtual void embed_rows_normed(const Tensor& ids, const Tensor& table, Tensor& x, const Tensor& norm_w, float eps,
                                 NormedRows& out);
  // x += a · wᵀ, then out = rms_norm(x; norm_w, eps): a layer's residual add and the norm after it.
  // x_copy: also copy(x, *x_copy) after the add (a feature layer's rows for a drafter), which a
  // backend may store from the product's own epilogue.
  virtual void matmul_add_norm(const Tensor& a, const Tensor& w, Tensor& x, const Tensor& norm_w, float eps,
                               NormedRows& out, Tensor* x_copy = nullptr);
  // y = in · wᵀ, and act = silu(in · w_gateᵀ) ⊙ (in · w_upᵀ) as matmul_silu_mul.
  virtual void matmul_normed(const NormedRows& in, const Tensor& w, Tensor& y);
  // ids (I32 [in.h.rows, 1], from alloc) ← each row's argmax of in · wᵀ by argmax_rows' rule,
  // the product itself not kept: a greedy pass's last projection and choice in one. A backend
  // may choose inside the product's own kernel (CUDA: the LM head's last block, no logits
  // stored and read back); the ids must be those of matmul_normed then argmax_rows_into.
  virtual void matmul_normed_argmax(const NormedRows& in, const Tensor& w, Tensor& ids);
  virtual void matmul_silu_mul_normed(const NormedRows& in, const Tensor& w_gate_up, Tensor& act);
  // act [T, I] = silu(x · w_gateᵀ) ⊙ (x · w_upᵀ) for w_gate_up [2I, K] (gate rows, then up
  // rows), each product rounded to the activation dtype first: matmul, then silu_mul.
  virtual void matmul_silu_mul(const Tensor& x, const Tensor& w_gate_up, Tensor& act);
  // Per head of head_dim: q ← rope(rms_norm(q; q_norm)) in place (skipped when q is empty),
  // k_dst ← rope(rms_norm(k; k_norm)), v_dst ← v. Positions as in rope().
  virtual void qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                  const Tensor& k_norm, float eps, const std::vector<int32_t>& positions,
                                  int64_t head_dim, const RopeTable& table, Tensor& k_dst, Tensor& v_dst);
  // One layer's part of kv_norm_rope_store.
  struct KvRows {
    Tensor k, v, k_norm, k_dst, v_dst;
  };
  // qk_norm_rope_store without q, for several layers' keys and values of the same rows (the
  // drafter's context rows: every layer's k/v come from one product). The default stores them
  // layer by layer; a backend may store all layers at once, with the same numbers.
  virtual void kv_norm_rope_store(const std::vector<KvRows>& layers, float eps, const std::vector<int32_t>& positions,
                                  int64_t head_dim, const RopeTable& table);
};

// The shape of several checkpoint tensors concatenated along rows (a fused projection; a 1-D
// tensor counts as one row), checked to share their column count. Shared by the backends'
// upload_weight().
struct FusedWeightShape {
  int64_t rows = 0, cols = 0;
  bool all_matrices = true;  // every part is 2-D
  bool all_bf16 = true;      // every part is stored as bf16
};
FusedWeightShape fused_weight_shape(const std::vector<const TensorInfo*>& parts);

std::unique_ptr<Backend> make_cpu_backend();
// Null when this build has no CUDA backend or no GPU is present.
std::unique_ptr<Backend> make_cuda_backend();
// "cpu", "cuda" or "auto" (CUDA when available).
std::unique_ptr<Backend> make_backend(const std::string& which);

}  // namespace dflash
