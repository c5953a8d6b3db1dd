#include "engine/logit_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>

#include "util/error.h"

namespace dflash {
namespace {
// Rows of top-k survivors the device hands over; beyond this, sampling reads whole rows.
constexpr int kMaxDeviceTopK = 1024;
// Top-p candidates a row may bring back; a row with more (a flat distribution) is read whole.
constexpr int kMaxTopPCandidates = 2048;
}  // namespace

// Row r of logits left on the device, as a law: p(id) from the row's max and mass and the logit
// there; draws and the excess over another such row drawn there, with the host's uniforms.
// What one trip brought back is kept (the law, from a draw or LogitRows::look_up; the scaled
// logits of drawn and looked-up ids), so p(d) and q(d) need no trip of their own. A top-p law
// (Backend::top_p_laws) is known from the start and goes with every draw.
class DeviceRowLaw final : public TokenLaw {
 public:
  DeviceRowLaw(Backend& b, Tensor logits, int64_t r, float inv_t, std::optional<RowLaw> top_p_law)
      : b_(b), logits_(std::move(logits)), r_(r), inv_t_(inv_t), top_p_(top_p_law.has_value()), law_(top_p_law) {}
  double prob(int32_t id) const override {
    const auto known = std::find_if(known_.begin(), known_.end(), [&](const auto& k) { return k.first == id; });
    const float s = known != known_.end() ? known->second : b_.scaled_at(logits_, inv_t_, {{r_, id}})[0];
    return std::isnan(s) || !law().admits(s, id) ? 0.0 : std::exp(double(s) - double(law().max)) / law().mass;
  }
  int32_t draw(Rng& rng) const override {
    return take(b_.draw_from_rows(logits_.slice_rows(r_, 1), inv_t_, {rng.uniform()}, given_laws())[0]);
  }
  int32_t draw_excess_over(const TokenLaw& q_law, Rng& rng) const override {
    const auto* q = dynamic_cast<const DeviceRowLaw*>(&q_law);
    if (!q) return SupportLaw(support()).draw_excess_over(q_law, rng);
    return b_.draw_from_excess(logits_, r_, law(), q->logits_, q->r_, q->law(), inv_t_, rng.uniform());
  }
  TokenDistribution support() const override {
    std::vector<float> row(size_t(logits_.cols));
    b_.download(logits_.slice_rows(r_, 1), row.data());
    TokenDistribution d;
    for (size_t i = 0; i < row.size(); ++i) {
      const float s = row[i] * inv_t_;
      if (std::isnan(s) || s == -INFINITY || !law().admits(s, static_cast<int32_t>(i))) continue;
      d.ids.push_back(static_cast<int32_t>(i));
      d.probs.push_back(static_cast<float>(std::exp(double(s) - double(law().max)) / law().mass));
    }
    return d;
  }
  // The laws draw_from_rows is handed for this row: its top-p law, or none (the draw works out
  // the whole softmax).
  std::vector<RowLaw> given_laws() const { return top_p_ ? std::vector<RowLaw>{*law_} : std::vector<RowLaw>{}; }
  // A draw made for this row elsewhere (LogitRows::choose_rows): its token; its law and scaled
  // logit kept.
  int32_t take(const RowDraw& d) const {
    if (d.id < 0)
      throw Error("sampling: logits row " + std::to_string(r_) + " of " + logits_.describe() +
                  " has no finite value to draw from");
    law_ = d.law;
    know(d.id, d.scaled);
    return d.id;
  }
  void know(const RowLaw& law) const { law_ = law; }
  void know(int32_t id, float scaled) const { known_.emplace_back(id, scaled); }

 private:
  const RowLaw& law() const {
    if (!law_) law_ = b_.row_laws(logits_.slice_rows(r_, 1), inv_t_, {}).law[0];
    return *law_;
  }

  Backend& b_;
  Tensor logits_;
  int64_t r_;
  float inv_t_;
  bool top_p_;
  mutable std::optional<RowLaw> law_;
  mutable std::vector<std::pair<int32_t, float>> known_;  // a few ids a step: a list is enough
};

LogitRows::LogitRows(Backend& b, const SamplingParams& sp, int vocab)
    : backend_(b),
      sp_(sp.without_penalties()),
      vocab_(vocab),
      inv_t_(sp.greedy() ? 1.f : static_cast<float>(1.0 / sp.temperature)) {
  if (sp.penalised()) penalty_history_.emplace(sp, vocab);
  const bool sampled = !sp.greedy(), every_k = sp.top_k == 0 || sp.top_k >= vocab;
  // Temperature alone: no candidate set is smaller than the row.
  const bool temperature_alone = sampled && every_k && sp.top_p >= 1.0 && sp.min_p == 0.0;
  // Min-p alone: its cut is a value (Backend::top_p_laws), so every row is a law on the device.
  const bool min_p_alone = sampled && every_k && sp.top_p >= 1.0 && sp.min_p > 0.0;
  const bool on_gpu = b.device() != DeviceKind::CPU;
  if (sp.greedy()) form_ = Form::Argmax;
  else if (sampled && !every_k && sp.top_k <= kMaxDeviceTopK) form_ = Form::TopK;
  else if (sampled && every_k && sp.top_p < 1.0) form_ = Form::TopP;
  // Rows stay where they are, unless they are on the host already (there the host's own pass
  // over a row is the cheaper one: bench/sampling_bench).
  else if (temperature_alone && on_gpu) form_ = Form::DeviceRows;
  else if (min_p_alone && on_gpu) form_ = Form::TopP;
  else form_ = Form::Rows;
  // DFLASH_LOGIT_ROWS=whole reads every sampled or penalised row whole (as before the candidate
  // and device forms: measuring); =device keeps temperature-alone rows, and every top-p or min-p row
  // whatever its candidates, where they are on any backend (measuring, and the CPU tests of
  // those forms). The same distributions either way.
  const char* e = std::getenv("DFLASH_LOGIT_ROWS");
  const std::string env = e ? e : "";
  if (env == "whole" && (form_ != Form::Argmax || penalty_history_)) form_ = Form::Rows;
  if (env == "device" && temperature_alone) form_ = Form::DeviceRows;
  if (env == "device" && min_p_alone) form_ = Form::TopP;
  // A top-p row whose nucleus is over the candidate cap keeps its law (Backend::top_p_laws)
  // where the row is; on the host the host's own pass reads it.
  laws_on_device_ = form_ == Form::TopP && (on_gpu || env == "device");
  every_row_a_law_ = form_ == Form::TopP && (min_p_alone || env == "device");
}

void LogitRows::read(const Tensor& logits, const TokenHistory& h) {
  if (logits.cols != vocab_)
    throw Error("logit rows: " + logits.describe() + " for a vocabulary of " + std::to_string(vocab_));
  logits_ = logits;
  if (penalty_history_) {  // on a copy, so that the caller's logits stay as they were
    logits_ = backend_.alloc(logits.rows, logits.cols, DType::F32);
    backend_.copy(logits, logits_);
    backend_.apply_penalties(logits_, penalty_history_->tokens(h, int(logits.rows)));
  }
  row_read_.assign(size_t(logits_.rows), 0);
  laws_.clear();
  laws_.resize(size_t(logits_.rows));
  switch (form_) {
    case Form::Argmax:
      argmax_ = backend_.argmax_rows(logits_);
      break;
    case Form::TopK:
      candidates_ = backend_.top_k_rows(logits_, sp_.top_k, inv_t_, 4 * sp_.top_k + 64);
      break;
    case Form::TopP: {
      top_p_laws_.clear();
      const float top_p = static_cast<float>(sp_.top_p), min_p = static_cast<float>(sp_.min_p);
      if (every_row_a_law_) {
        candidates_.assign(size_t(logits_.rows), CandidateRow{});
        top_p_laws_ = backend_.top_p_laws(logits_, inv_t_, top_p, min_p);
        break;
      }
      candidates_ = backend_.top_p_rows(logits_, inv_t_, top_p, kMaxTopPCandidates);
      const bool overflow =
          std::any_of(candidates_.begin(), candidates_.end(), [](const CandidateRow& c) { return c.ids.empty(); });
      if (overflow && laws_on_device_) top_p_laws_ = backend_.top_p_laws(logits_, inv_t_, top_p, min_p);
      break;
    }
    case Form::DeviceRows:  // nothing yet: each law comes with the first trip that needs it
      break;
    case Form::Rows:
      rows_.resize(size_t(logits_.rows * logits_.cols));
      backend_.download(logits_, rows_.data());
      std::fill(row_read_.begin(), row_read_.end(), 1);
      break;
  }
}

const float* LogitRows::row(int r) {
  if (!row_read_[size_t(r)]) {
    rows_.resize(std::max(rows_.size(), size_t(logits_.rows * logits_.cols)));
    backend_.download(logits_.slice_rows(r, 1), rows_.data() + size_t(r) * vocab_);
    row_read_[size_t(r)] = 1;
  }
  return rows_.data() + size_t(r) * vocab_;
}

bool LogitRows::has_candidates(int r) const {
  return (form_ == Form::TopK || form_ == Form::TopP) && !candidates_[size_t(r)].ids.empty();
}

bool LogitRows::on_device(int r) const {
  return form_ == Form::DeviceRows || (!top_p_laws_.empty() && !has_candidates(r));
}

std::unique_ptr<TokenLaw> LogitRows::support_law(int r) const {
  if (has_candidates(r)) {
    const CandidateRow& c = candidates_[size_t(r)];
    return std::make_unique<SupportLaw>(distribution_of_candidates(c.ids, c.scaled, sp_, c.row_mass));
  }
  return std::make_unique<SupportLaw>(token_distribution(rows_.data() + size_t(r) * vocab_, vocab_, sp_, {}));
}

const TokenLaw& LogitRows::law(int r) {
  std::unique_ptr<TokenLaw>& law = laws_[size_t(r)];
  if (law) return *law;
  if (on_device(r)) {
    std::optional<RowLaw> top_p_law;
    if (form_ == Form::TopP) top_p_law = top_p_laws_[size_t(r)];
    law = std::make_unique<DeviceRowLaw>(backend_, logits_, r, inv_t_, top_p_law);
  } else {
    if (!has_candidates(r)) row(r);
    law = support_law(r);
  }
  return *law;
}

void LogitRows::build_laws(int n) {
  std::vector<int> todo;
  int whole = 0;
  for (int r = 0; r < n; ++r) {
    if (laws_[size_t(r)]) continue;
    if (on_device(r)) {  // nothing to build on the host
      law(r);
      continue;
    }
    todo.push_back(r);
    if (!has_candidates(r)) {
      row(r);  // downloads stay on this thread
      ++whole;
    }
  }
  // A vocabulary-sized row read whole costs milliseconds on the host (a flat row's nucleus is
  // most of it); rows from candidates, or a small vocabulary's, cost microseconds, less than
  // waking the threads (H200 host, shipped pair: 10 % slower in parallel).
  std::vector<std::exception_ptr> errors(todo.size());
#pragma omp parallel for schedule(dynamic) if (whole > 1 && int64_t(whole) * vocab_ > (1 << 18))
  for (size_t i = 0; i < todo.size(); ++i) {
    try {
      laws_[size_t(todo[i])] = support_law(todo[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  }
  for (const auto& e : errors)  // the first row's error, as building them in order would throw
    if (e) std::rethrow_exception(e);
}

const DeviceRowLaw& LogitRows::device_law(int r) { return static_cast<const DeviceRowLaw&>(law(r)); }

void LogitRows::choose_rows(int32_t* out, int n, Rng& rng) {
  bool all_on_device = n > 0;
  for (int r = 0; r < n && all_on_device; ++r) all_on_device = on_device(r);
  if (all_on_device) {
    std::vector<double> u(static_cast<size_t>(n));
    for (double& v : u) v = rng.uniform();  // one a row, in row order: what n single draws would take
    std::vector<RowLaw> laws;
    if (form_ == Form::TopP) laws.assign(top_p_laws_.begin(), top_p_laws_.begin() + n);
    const std::vector<RowDraw> drawn = backend_.draw_from_rows(logits_, inv_t_, u, laws);
    for (int r = 0; r < n; ++r) out[r] = device_law(r).take(drawn[size_t(r)]);
    return;
  }
  // A row's law does not depend on the tokens drawn before it (read() penalised the rows), so
  // the block's laws can be built at once, on every core, before the draws take their uniforms
  // in row order: the same laws, the same tokens.
  if (!sp_.greedy()) build_laws(n);
  for (int r = 0; r < n; ++r) out[r] = sp_.greedy() ? choose(r, rng) : law(r).draw(rng);
}

void LogitRows::look_up(const int32_t* ids, int n) {
  if (form_ == Form::TopP && !top_p_laws_.empty()) {  // the laws are known: only the logits at ids
    std::vector<std::pair<int64_t, int32_t>> at;
    for (int r = 0; r < n; ++r)
      if (on_device(r)) at.emplace_back(r, ids[r]);
    if (at.empty()) return;
    const std::vector<float> scaled = backend_.scaled_at(logits_, inv_t_, at);
    for (size_t i = 0; i < at.size(); ++i) device_law(int(at[i].first)).know(at[i].second, scaled[i]);
    return;
  }
  if (form_ != Form::DeviceRows) return;
  const RowLaws got = backend_.row_laws(logits_, inv_t_, std::vector<int32_t>(ids, ids + n));
  for (int r = 0; r < logits_.rows; ++r) device_law(r).know(got.law[size_t(r)]);
  for (int r = 0; r < n; ++r) device_law(r).know(ids[r], got.scaled[size_t(r)]);
}

int32_t LogitRows::choose(int r, Rng& rng) {
  if (form_ == Form::Argmax) return argmax_[size_t(r)];
  if (sp_.greedy()) return dflash::argmax(row(r), vocab_);  // penalised rows read whole (measuring)
  return law(r).draw(rng);
}

int32_t LogitRows::argmax(int r) {
  if (form_ == Form::Argmax) return argmax_[size_t(r)];
  return dflash::argmax(row(r), vocab_);
}

}  // namespace dflash
