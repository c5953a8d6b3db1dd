#include "backend/backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include "backend/top_p_fixed.h"
#include "util/error.h"

namespace dflash {

void select_top_k(const float* row, int n, int k, float inv_t, CandidateRow& out) {
  out.ids.clear();
  out.scaled.clear();
  k = std::min(k, n);
  if (k <= 0) {
    out.count = 0;
    return;
  }
  // The k largest in a min-heap (NaN ranked below everything); most values fail against its top.
  auto below = [](float a, float b) { return std::isnan(b) ? false : std::isnan(a) || a < b; };
  auto min_heap = [&](float a, float b) { return below(b, a); };
  std::vector<float> heap;
  heap.reserve(size_t(k));
  for (int i = 0; i < n; ++i) {
    const float s = row[i] * inv_t;
    if (int(heap.size()) < k) {
      heap.push_back(s);
      std::push_heap(heap.begin(), heap.end(), min_heap);
    } else if (below(heap.front(), s)) {
      std::pop_heap(heap.begin(), heap.end(), min_heap);
      heap.back() = s;
      std::push_heap(heap.begin(), heap.end(), min_heap);
    }
  }
  const float kth = heap.front();
  for (int i = 0; i < n; ++i) {
    const float s = row[i] * inv_t;
    if (s >= kth) {
      out.ids.push_back(i);
      out.scaled.push_back(s);
    }
  }
  out.count = static_cast<int>(out.ids.size());
}

void select_top_p(const float* row, int n, float inv_t, float top_p, CandidateRow& out) {
  out.ids.clear();
  out.scaled.clear();
  float mx = -INFINITY;
  for (int i = 0; i < n; ++i) mx = std::max(mx, row[i] * inv_t);  // NaN never wins std::max's first argument
  std::vector<double> bucket_mass(kTopPBuckets, 0.0);
  auto bucket_of = [&](float s) {
    const float d = (mx - s) * kTopPBucketsPerUnit;
    return d < float(kTopPBuckets - 1) ? static_cast<int>(d) : kTopPBuckets - 1;
  };
  double mass = 0;
  for (int i = 0; i < n; ++i) {
    const float s = row[i] * inv_t;
    if (std::isnan(s)) continue;
    const float e = std::exp(s - mx);
    bucket_mass[size_t(bucket_of(s))] += e;
    mass += e;
  }
  const double budget = (1.0 - double(top_p)) * (1.0 - 1e-3) * mass;
  int last = kTopPBuckets - 1;  // the last candidate bucket
  for (double left_out = 0; last > 0 && left_out + bucket_mass[size_t(last)] <= budget; --last)
    left_out += bucket_mass[size_t(last)];
  for (int i = 0; i < n; ++i) {
    const float s = row[i] * inv_t;
    if (!std::isnan(s) && bucket_of(s) <= last) {
      out.ids.push_back(i);
      out.scaled.push_back(s);
    }
  }
  out.count = static_cast<int>(out.ids.size());
  out.row_mass = mass;
}

namespace {
// The default ids ops' tensors: host I32 [rows, 1] (rows < 0: any number).
void expect_host_ids(const Backend& b, const Tensor& ids, int64_t rows, const char* op) {
  if (ids.device != DeviceKind::CPU || ids.dtype != DType::I32 || ids.cols != 1 || (rows >= 0 && ids.rows != rows))
    throw Error(b.name() + " " + op + ": ids must be host I32 [" + (rows >= 0 ? std::to_string(rows) : "rows") +
                ", 1], got " + ids.describe());
}

std::vector<int32_t> host_ids(const Backend& b, const Tensor& ids, const char* op) {
  expect_host_ids(b, ids, -1, op);
  std::vector<int32_t> v(size_t(ids.rows));
  for (int64_t r = 0; r < ids.rows; ++r) v[size_t(r)] = ids.ptr<int32_t>()[r * ids.ld];
  return v;
}

void set_host_ids(const Backend& b, const std::vector<int32_t>& v, Tensor& ids, const char* op) {
  expect_host_ids(b, ids, static_cast<int64_t>(v.size()), op);
  for (int64_t r = 0; r < ids.rows; ++r) ids.ptr<int32_t>()[r * ids.ld] = v[size_t(r)];
}

class ReadyIds final : public PendingIds {
 public:
  explicit ReadyIds(std::vector<int32_t> v) : v_(std::move(v)) {}
  std::vector<int32_t> get() override { return v_; }

 private:
  std::vector<int32_t> v_;
};
}  // namespace

void Backend::argmax_rows_into(const Tensor& x, Tensor& ids) {
  set_host_ids(*this, argmax_rows(x), ids, "argmax_rows_into");
}

void Backend::embed_rows(const Tensor& ids, const Tensor& table, Tensor& out) {
  embed(host_ids(*this, ids, "embed_rows"), table, out);
}

std::unique_ptr<PendingIds> Backend::read_ids(const Tensor& ids) {
  return std::make_unique<ReadyIds>(host_ids(*this, ids, "read_ids"));
}

void Backend::queue_recorded(const std::string&, const std::function<void()>& step,
                             std::unique_ptr<QueueMark>* started) {
  if (started) *started = mark();
  step();
}

void Backend::write_ids(const std::vector<int32_t>& v, Tensor& ids) { set_host_ids(*this, v, ids, "write_ids"); }

namespace {
struct HostClockMark final : QueueMark {
  std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now();
};

const HostClockMark& host_clock_mark(const Backend& b, const QueueMark& m, const char* op) {
  const auto* h = dynamic_cast<const HostClockMark*>(&m);
  if (!h) throw Error(b.name() + " " + op + ": a mark from another backend");
  return *h;
}
}  // namespace

std::unique_ptr<QueueMark> Backend::mark() { return std::make_unique<HostClockMark>(); }

double Backend::seconds_between(const QueueMark& from, const QueueMark& to) {
  const auto& a = host_clock_mark(*this, from, "seconds_between");
  const auto& b = host_clock_mark(*this, to, "seconds_between");
  return std::chrono::duration<double>(b.at - a.at).count();
}

namespace {

// One row of F32 logits on the host (a copy from wherever they are).
std::vector<float> host_row(Backend& b, const Tensor& logits, int64_t r, const char* op) {
  if (logits.dtype != DType::F32) throw Error(std::string(op) + ": logits " + logits.describe() + " are not F32");
  if (r < 0 || r >= logits.rows)
    throw Error(std::string(op) + ": row " + std::to_string(r) + " of " + logits.describe());
  std::vector<float> row(size_t(logits.cols));
  b.download(logits.slice_rows(r, 1), row.data());
  return row;
}

// exp(scaled − max) in f64, 0 for NaN and −inf: each token's weight in its row's law. (In f32 the
// device's expf and the host's may differ by an ulp, and summed over a vocabulary such
// differences move every boundary of the cumulative sums: the backends' draws would part far
// more often than f64 rounding makes them.)
inline double weight(float logit, float inv_t, float max) {
  const float s = logit * inv_t;
  return std::isnan(s) || s == -INFINITY ? 0.0 : std::exp(double(s) - double(max));
}

// The first i at which Σ_{j ≤ i} w(j) exceeds u · Σ w, summed in id order; the last i with
// weight where rounding leaves none; -1 when every weight is 0.
template <typename W>
int32_t draw_by_weights(int64_t n, W w, double u) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += w(i);
  if (!(total > 0)) return -1;
  const double target = u * total;
  double acc = 0;
  int32_t last = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double v = w(i);
    if (v <= 0) continue;
    acc += v;
    last = static_cast<int32_t>(i);
    if (target < acc) return last;
  }
  return last;
}

// A row's law: its max scaled logit (NaN skipped) and mass, each weight in f64.
RowLaw law_of(const std::vector<float>& row, float inv_t) {
  float mx = -INFINITY;
  for (float v : row) mx = std::max(mx, v * inv_t);
  double mass = 0;
  for (float v : row) mass += weight(v, inv_t, mx);
  return {mx, mass};
}

// weight(), 0 where the law does not admit the token.
inline double admitted_weight(const RowLaw& law, float logit, float inv_t, int64_t id) {
  return law.admits(logit * inv_t, static_cast<int32_t>(id)) ? weight(logit, inv_t, law.max) : 0.0;
}

// top_p_laws' top-p cut for one row (its max known, something finite), stated plainly
// (sorting): the device finds the same cut by histograms (row_law.cu), from the same integers.
void top_p_cut_of(const std::vector<float>& row, float inv_t, float top_p, RowLaw& law) {
  struct Token {
    float scaled;
    int32_t id;
    uint64_t fixed;
  };
  std::vector<Token> tokens;
  uint64_t total = 0;
  for (size_t i = 0; i < row.size(); ++i) {
    const uint64_t f = top_p_fixed_weight(weight(row[i], inv_t, law.max));
    if (f == 0) continue;  // below every token that moves the sums, and dropped with them
    tokens.push_back({row[i] * inv_t, static_cast<int32_t>(i), f});
    total += f;
  }
  std::sort(tokens.begin(), tokens.end(),
            [](const Token& a, const Token& b) { return a.scaled != b.scaled ? a.scaled < b.scaled : a.id < b.id; });
  const uint64_t drop = top_p_drop_fixed(top_p, total);
  uint64_t below = 0;
  size_t j = 0;
  while (j + 1 < tokens.size() && below + tokens[j].fixed <= drop) below += tokens[j++].fixed;
  law.cut = tokens[j].scaled;
  const bool lowest_tie = j == 0 || tokens[j - 1].scaled != tokens[j].scaled;
  law.cut_id = lowest_tie ? 0 : tokens[j].id;
}

// top_p_laws' law of one row: the stricter of the top-p and min-p cuts, then the mass it keeps.
RowLaw top_p_law_of(const std::vector<float>& row, float inv_t, float top_p, float min_p) {
  RowLaw law = law_of(row, inv_t);
  law.mass = 0;
  if (law.max == -INFINITY) {  // nothing finite: nothing admitted
    law.cut = INFINITY;
    return law;
  }
  if (top_p < 1.f) top_p_cut_of(row, inv_t, top_p, law);
  const float min_p_at = min_p_cut(law.max, min_p);
  if (min_p_at > law.cut) law = RowLaw{law.max, 0.0, min_p_at, 0};  // the stricter cut of the two
  for (size_t i = 0; i < row.size(); ++i) law.mass += admitted_weight(law, row[i], inv_t, int64_t(i));
  return law;
}
}  // namespace

void Backend::check_row_ids(const Tensor& logits, const std::vector<int32_t>& ids, const char* op) {
  if (int64_t(ids.size()) > logits.rows)
    throw Error(std::string(op) + ": " + std::to_string(ids.size()) + " ids for " + logits.describe());
  for (size_t r = 0; r < ids.size(); ++r)
    if (ids[r] < 0 || ids[r] >= logits.cols)
      throw Error(std::string(op) + ": id " + std::to_string(ids[r]) + " of row " + std::to_string(r) + " outside " +
                  logits.describe());
}

RowLaws Backend::row_laws(const Tensor& logits, float inv_t, const std::vector<int32_t>& ids) {
  check_row_ids(logits, ids, "row_laws");
  RowLaws out;
  for (int64_t r = 0; r < logits.rows; ++r) {
    const std::vector<float> row = host_row(*this, logits, r, "row_laws");
    out.law.push_back(law_of(row, inv_t));
    // From the row in hand, not a download of its own.
    if (size_t(r) < ids.size()) out.scaled.push_back(row[size_t(ids[size_t(r)])] * inv_t);
  }
  return out;
}

std::vector<float> Backend::scaled_at(const Tensor& logits, float inv_t,
                                      const std::vector<std::pair<int64_t, int32_t>>& at) {
  std::vector<float> out;
  for (const auto& [r, id] : at) {
    if (id < 0 || id >= logits.cols) throw Error("scaled_at: id " + std::to_string(id) + " of " + logits.describe());
    if (r < 0 || r >= logits.rows) throw Error("scaled_at: row " + std::to_string(r) + " of " + logits.describe());
    float v = 0.f;
    download(logits.slice_rows(r, 1).slice_cols(id, 1), &v);
    out.push_back(v * inv_t);
  }
  return out;
}

void Backend::check_draw_args(const Tensor& logits, const std::vector<double>& u, const std::vector<RowLaw>& laws) {
  if (int64_t(u.size()) > logits.rows)
    throw Error("draw_from_rows: " + std::to_string(u.size()) + " uniforms for " + logits.describe());
  if (!laws.empty() && laws.size() != u.size())
    throw Error("draw_from_rows: " + std::to_string(laws.size()) + " laws for " + std::to_string(u.size()) +
                " uniforms");
}

std::vector<RowDraw> Backend::draw_from_rows(const Tensor& logits, float inv_t, const std::vector<double>& u,
                                             const std::vector<RowLaw>& laws) {
  check_draw_args(logits, u, laws);
  std::vector<RowDraw> out(u.size());
  for (size_t r = 0; r < u.size(); ++r) {
    const auto row = host_row(*this, logits, int64_t(r), "draw_from_rows");
    const RowLaw law = laws.empty() ? law_of(row, inv_t) : laws[r];
    const int32_t id =
        draw_by_weights(logits.cols, [&](int64_t i) { return admitted_weight(law, row[size_t(i)], inv_t, i); }, u[r]);
    out[r] = {id, id < 0 ? 0.f : row[size_t(id)] * inv_t, law};
  }
  return out;
}

std::vector<RowLaw> Backend::top_p_laws(const Tensor& logits, float inv_t, float top_p, float min_p) {
  check_top_p(top_p, min_p, "top_p_laws");
  std::vector<RowLaw> out;
  for (int64_t r = 0; r < logits.rows; ++r)
    out.push_back(top_p_law_of(host_row(*this, logits, r, "top_p_laws"), inv_t, top_p, min_p));
  return out;
}

void Backend::check_penalty_tokens(const Tensor& logits, const PenaltyTokens& t) {
  const std::string op = "apply_penalties: ";
  if (logits.dtype != DType::F32) throw Error(op + "logits " + logits.describe() + " are not F32");
  if (t.row_first.empty() || int64_t(t.row_first.size()) - 1 > logits.rows)
    throw Error(op + std::to_string(t.row_first.size()) + " row offsets for " + logits.describe());
  if (t.row_first.front() != 0 || t.row_first.back() != int64_t(t.own.size()))
    throw Error(op + "row offsets do not span the " + std::to_string(t.own.size()) + " own entries");
  for (size_t r = 1; r < t.row_first.size(); ++r) {
    if (t.row_first[r] < t.row_first[r - 1]) throw Error(op + "row offset " + std::to_string(r) + " goes back");
    if (t.row_first[r] - t.row_first[r - 1] > PenaltyTokens::kMaxOwn)
      throw Error(op + "row " + std::to_string(r - 1) + " has " + std::to_string(t.row_first[r] - t.row_first[r - 1]) +
                  " own entries, more than " + std::to_string(PenaltyTokens::kMaxOwn));
  }
  auto check = [&](const std::vector<PenaltyEntry>& list, const char* name) {
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i].id < 0 || list[i].id >= logits.cols)
        throw Error(op + name + " entry " + std::to_string(i) + ": id " + std::to_string(list[i].id) + " outside " +
                    logits.describe());
  };
  check(t.every_row, "every_row");
  check(t.own, "own");
}

void Backend::penalise_row(float* row, int64_t r, const PenaltyTokens& t) {
  const PenaltyEntry* own = t.own.data() + t.row_first[size_t(r)];
  const PenaltyEntry* own_end = t.own.data() + t.row_first[size_t(r) + 1];
  auto overridden = [&](int32_t id) {
    for (const PenaltyEntry* e = own; e != own_end; ++e)
      if (e->id == id) return true;
    return false;
  };
  // Each step in its own pass through memory, as apply_penalties takes them: each rounds, and
  // x · repetition − subtract is never fused into one rounding.
  enum Step { kBias, kRepetition, kSubtract };
  auto pass = [&](const PenaltyEntry* e, const PenaltyEntry* end, bool skip_own, Step step) {
    for (; e != end; ++e) {
      if (skip_own && overridden(e->id)) continue;
      float& x = row[e->id];
      if (step == kBias && e->bias != 0.f) x += e->bias;
      if (step == kRepetition && e->repeated) x = x < 0 ? x * t.repetition : x / t.repetition;
      if (step == kSubtract && e->subtract != 0.f) x -= e->subtract;
    }
  };
  const PenaltyEntry* all = t.every_row.data();
  for (Step step : {kBias, kRepetition, kSubtract}) pass(all, all + t.every_row.size(), true, step);
  for (Step step : {kBias, kRepetition, kSubtract}) pass(own, own_end, false, step);
}

void Backend::check_top_p(float top_p, float min_p, const char* op) {
  if (!(top_p > 0.f && top_p <= 1.f))
    throw Error(std::string(op) + ": top_p " + std::to_string(top_p) + " outside (0, 1]");
  if (!(min_p >= 0.f && min_p <= 1.f))
    throw Error(std::string(op) + ": min_p " + std::to_string(min_p) + " outside [0, 1]");
}

int32_t Backend::draw_from_excess(const Tensor& p_logits, int64_t rp, const RowLaw& lp, const Tensor& q_logits,
                                  int64_t rq, const RowLaw& lq, float inv_t, double u) {
  if (p_logits.cols != q_logits.cols)
    throw Error("draw_from_excess: " + p_logits.describe() + " against " + q_logits.describe());
  const auto p = host_row(*this, p_logits, rp, "draw_from_excess"), q = host_row(*this, q_logits, rq, "draw_from_excess");
  return draw_by_weights(
      p_logits.cols,
      [&](int64_t i) {
        return std::max(0.0, admitted_weight(lp, p[size_t(i)], inv_t, i) / lp.mass -
                                 admitted_weight(lq, q[size_t(i)], inv_t, i) / lq.mass);
      },
      u);
}

namespace {

// The default candidate forms: the rows downloaded, `select` run on each, a row over max_count
// left with its count only.
template <typename Select>
std::vector<CandidateRow> candidates_on_host(Backend& b, const Tensor& logits, int max_count, const char* op,
                                             Select select) {
  if (logits.dtype != DType::F32) throw Error(std::string(op) + ": logits " + logits.describe() + " are not F32");
  std::vector<float> rows(size_t(logits.rows * logits.cols));
  b.download(logits, rows.data());
  std::vector<CandidateRow> out(size_t(logits.rows));
  // Rows are independent, and a vocabulary-sized row costs milliseconds (the sampler's drafted
  // block is 16 of them).
#pragma omp parallel for schedule(dynamic) if (logits.rows > 1 && logits.rows * logits.cols > (1 << 18))
  for (int64_t r = 0; r < logits.rows; ++r) {
    CandidateRow& c = out[size_t(r)];
    select(rows.data() + r * logits.cols, static_cast<int>(logits.cols), c);
    if (c.count > max_count) {
      c.ids.clear();
      c.scaled.clear();
    }
  }
  return out;
}

}  // namespace

std::vector<CandidateRow> Backend::top_p_rows(const Tensor& logits, float inv_t, float top_p, int max_count) {
  return candidates_on_host(*this, logits, max_count, "top_p_rows", [&](const float* row, int n, CandidateRow& c) {
    select_top_p(row, n, inv_t, top_p, c);
  });
}

std::vector<CandidateRow> Backend::top_k_rows(const Tensor& logits, int k, float inv_t, int max_count) {
  return candidates_on_host(*this, logits, max_count, "top_k_rows", [&](const float* row, int n, CandidateRow& c) {
    select_top_k(row, n, k, inv_t, c);
  });
}

void Backend::norm_rows(const Tensor& x, const Tensor& norm_w, float eps, NormedRows& out) {
  rms_norm(x, norm_w, eps, x.cols, out.h);
  out.partial = Tensor();
  out.x = x;
  out.norm_w = norm_w;
  out.eps = eps;
  out.deferred = false;
}

void Backend::matmul_add_norm(const Tensor& a, const Tensor& w, Tensor& x, const Tensor& norm_w, float eps,
                              NormedRows& out, Tensor* x_copy) {
  matmul(a, w, x, /*accumulate=*/true);
  norm_rows(x, norm_w, eps, out);
  if (x_copy) copy(x, *x_copy);
}

namespace {
// The normalised rows of `in`, recomputed from its x where it was left deferred.
Tensor normalised(Backend& b, const NormedRows& in) {
  if (!in.deferred) return in.h;
  Tensor h = b.alloc(in.x.rows, in.x.cols, b.activation_dtype());
  b.rms_norm(in.x, in.norm_w, in.eps, in.x.cols, h);
  return h;
}
}  // namespace

void Backend::matmul_normed(const NormedRows& in, const Tensor& w, Tensor& y) { matmul(normalised(*this, in), w, y); }

void Backend::embed_normed(const std::vector<int32_t>& ids, const Tensor& table, Tensor& x, const Tensor& norm_w,
                           float eps, NormedRows& out) {
  embed(ids, table, x);
  norm_rows(x, norm_w, eps, out);
}

void Backend::embed_rows_normed(const Tensor& ids, const Tensor& table, Tensor& x, const Tensor& norm_w, float eps,
                                NormedRows& out) {
  embed_rows(ids, table, x);
  norm_rows(x, norm_w, eps, out);
}

void Backend::matmul_normed_argmax(const NormedRows& in, const Tensor& w, Tensor& ids) {
  Tensor y = alloc(in.h.rows, w.rows, DType::F32);
  matmul_normed(in, w, y);
  argmax_rows_into(y, ids);
}

void Backend::matmul_silu_mul_normed(const NormedRows& in, const Tensor& w_gate_up, Tensor& act) {
  matmul_silu_mul(normalised(*this, in), w_gate_up, act);
}

void Backend::matmul_silu_mul(const Tensor& x, const Tensor& w_gate_up, Tensor& act) {
  Tensor gate_up = alloc(x.rows, w_gate_up.rows, activation_dtype());
  matmul(x, w_gate_up, gate_up);
  silu_mul(gate_up, act);
}

void Backend::qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm,
                                 const Tensor& k_norm, float eps, const std::vector<int32_t>& positions,
                                 int64_t head_dim, const RopeTable& table, Tensor& k_dst, Tensor& v_dst) {
  if (!q.empty()) {
    rms_norm(q, q_norm, eps, head_dim, q);
    rope(q, positions, head_dim, table);
  }
  rms_norm(k, k_norm, eps, head_dim, k_dst);
  rope(k_dst, positions, head_dim, table);
  copy(v, v_dst);
}

void Backend::kv_norm_rope_store(const std::vector<KvRows>& layers, float eps, const std::vector<int32_t>& positions,
                                 int64_t head_dim, const RopeTable& table) {
  Tensor none;
  for (const KvRows& l : layers) {
    Tensor k_dst = l.k_dst, v_dst = l.v_dst;
    qk_norm_rope_store(none, l.k, l.v, l.k_norm, l.k_norm, eps, positions, head_dim, table, k_dst, v_dst);
  }
}

FusedWeightShape fused_weight_shape(const std::vector<const TensorInfo*>& parts) {
  FusedWeightShape f;
  int64_t cols = -1;
  for (const auto* p : parts) {
    const int64_t r = p->shape.size() == 1 ? 1 : p->shape[0];
    const int64_t c = p->shape.size() == 1 ? p->shape[0] : p->numel() / p->shape[0];
    if (cols >= 0 && c != cols) throw Error("cannot fuse '" + p->name + "': column count differs");
    cols = c;
    f.rows += r;
    f.all_matrices = f.all_matrices && p->shape.size() == 2;
    f.all_bf16 = f.all_bf16 && p->dtype == DType::BF16;
  }
  f.cols = cols;
  return f;
}

}  // namespace dflash
