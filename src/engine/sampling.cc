#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "backend/backend.h"
#include "util/error.h"

namespace dflash {

void validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.0) || !std::isfinite(p.temperature)) throw Error("temperature must be >= 0");
  if (p.top_k < 0) throw Error("top_k must be >= 0");
  if (!(p.top_p > 0.0 && p.top_p <= 1.0)) throw Error("top_p must be in (0, 1]");
  if (!(p.min_p >= 0.0 && p.min_p <= 1.0)) throw Error("min_p must be in [0, 1]");
  if (!(p.repetition_penalty > 0.0)) throw Error("repetition_penalty must be > 0");
  if (!std::isfinite(p.presence_penalty)) throw Error("presence_penalty must be finite");
  if (!std::isfinite(p.frequency_penalty)) throw Error("frequency_penalty must be finite");
  std::unordered_set<int32_t> biased;
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0) throw Error("logit_bias: token id " + std::to_string(id) + " is negative");
    if (!std::isfinite(bias)) throw Error("logit_bias: the bias of token " + std::to_string(id) + " is not finite");
    if (!biased.insert(id).second) throw Error("logit_bias: token id " + std::to_string(id) + " is given twice");
  }
}

int32_t argmax(const float* v, int n) { return static_cast<int32_t>(std::max_element(v, v + n) - v); }

float penalty_subtract(const SamplingParams& p, int count) {
  return count > 0 ? static_cast<float>(count * p.frequency_penalty + p.presence_penalty) : 0.f;
}

void apply_penalties(float* logits, int vocab, const SamplingParams& p, const TokenHistory& h) {
  for (const auto& [t, bias] : p.logit_bias)
    if (t >= 0 && t < vocab) logits[t] += bias;
  if (p.repetition_penalty != 1.0) {
    std::unordered_set<int32_t> seen;
    auto mark = [&](int32_t t) { if (t >= 0 && t < vocab) seen.insert(t); };
    if (h.prompt) for (int32_t t : *h.prompt) mark(t);
    if (h.output) for (int32_t t : *h.output) mark(t);
    for (int i = 0; i < h.extra_count; ++i) mark(h.extra[i]);
    const float rp = static_cast<float>(p.repetition_penalty);
    for (int32_t t : seen) logits[t] = logits[t] < 0 ? logits[t] * rp : logits[t] / rp;
  }
  if (p.presence_penalty != 0.0 || p.frequency_penalty != 0.0) {
    std::unordered_map<int32_t, int> count;
    auto mark = [&](int32_t t) { if (t >= 0 && t < vocab) ++count[t]; };
    if (h.output) for (int32_t t : *h.output) mark(t);
    for (int i = 0; i < h.extra_count; ++i) mark(h.extra[i]);
    for (const auto& [t, c] : count)
      if (const float s = penalty_subtract(p, c); s != 0.f) logits[t] -= s;
  }
}

PenaltyHistory::PenaltyHistory(const SamplingParams& p, int vocab) : p_(p), vocab_(vocab) {}

PenaltyEntry& PenaltyHistory::entry(int32_t id) {
  int32_t& at = at_[size_t(id)];
  if (at < 0) {
    at = static_cast<int32_t>(every_row_.size());
    every_row_.push_back(PenaltyEntry{id, 0, 0.f, 0.f});
  }
  return every_row_[size_t(at)];
}

PenaltyTokens PenaltyHistory::tokens(const TokenHistory& h, int rows) {
  const bool repetition = p_.repetition_penalty != 1.0;
  const size_t prompt_size = h.prompt ? h.prompt->size() : 0, output_size = h.output ? h.output->size() : 0;
  // Another history than the one taken so far (not the same one grown): start again.
  if (at_.empty() || h.prompt != prompt_ || h.output != output_ || prompt_size < prompt_taken_ ||
      output_size < output_taken_) {
    at_.assign(size_t(vocab_), -1);
    count_.assign(size_t(vocab_), 0);
    every_row_.clear();
    for (const auto& [id, bias] : p_.logit_bias)
      if (id >= 0 && id < vocab_) entry(id).bias = bias;
    prompt_ = h.prompt;
    output_ = h.output;
    prompt_taken_ = output_taken_ = 0;
  }
  for (; prompt_taken_ < prompt_size; ++prompt_taken_) {
    const int32_t id = (*h.prompt)[prompt_taken_];
    if (repetition && id >= 0 && id < vocab_) entry(id).repeated = 1;
  }
  for (; output_taken_ < output_size; ++output_taken_) {
    const int32_t id = (*h.output)[output_taken_];
    if (id < 0 || id >= vocab_) continue;
    PenaltyEntry& e = entry(id);
    e.repeated = repetition;
    e.subtract = penalty_subtract(p_, ++count_[size_t(id)]);
  }
  PenaltyTokens t;
  t.repetition = static_cast<float>(p_.repetition_penalty);
  t.every_row = every_row_;
  // Row r's own entries: each token among the first r extra ones, with its whole penalty for
  // the row (its output count plus its count among them; drafts are output).
  std::vector<std::pair<int32_t, int>> drafted;  // id, count among the extra tokens so far
  t.row_first.push_back(0);
  for (int r = 0; r < rows; ++r) {
    if (r > 0 && r <= h.extra_count && h.extra[r - 1] >= 0 && h.extra[r - 1] < vocab_) {
      const int32_t id = h.extra[r - 1];
      auto it = std::find_if(drafted.begin(), drafted.end(), [&](const auto& d) { return d.first == id; });
      if (it == drafted.end()) drafted.emplace_back(id, 1);
      else ++it->second;
    }
    for (const auto& [id, n] : drafted) {
      const float bias = at_[size_t(id)] < 0 ? 0.f : every_row_[size_t(at_[size_t(id)])].bias;
      t.own.push_back(PenaltyEntry{id, uint32_t(repetition), penalty_subtract(p_, count_[size_t(id)] + n), bias});
    }
    t.row_first.push_back(static_cast<int32_t>(t.own.size()));
  }
  return t;
}

PenaltyTokens penalty_tokens(const SamplingParams& p, int vocab, const TokenHistory& h, int rows) {
  return PenaltyHistory(p, vocab).tokens(h, rows);
}

// The warpers keep a shrinking set of candidate tokens (ascending ids, with their scaled
// logits) instead of masking a vocabulary-sized row: after top-k only k (and ties) remain, so
// top-p, min-p and the softmax cost O(k), and top-p without top-k finds the nucleus in logit
// buckets instead of sorting the vocabulary.
// A token outside the set has probability exactly 0, as it had as a masked logit, so sums over
// the set in ascending id order equal the masked row's sums.
namespace {

// Softmax over the candidates: exp(l − max) in f32, the sum in f64 in id order, each
// probability rounded to f32 (the masked row's arithmetic, term for term). With row_mass > 0
// the candidates are part of a row whose Σ exp(l − max) that is (top_p_rows), the tokens left
// out holding the rest; returns the left-out tokens' share of the mass.
double candidate_softmax(const std::vector<float>& val, std::vector<float>& prob, double row_mass = 0) {
  float mx = -std::numeric_limits<float>::infinity();
  for (float v : val) mx = std::max(mx, v);
  double sum = 0;
  prob.resize(val.size());
  for (size_t j = 0; j < val.size(); ++j) {
    prob[j] = std::exp(val[j] - mx);
    sum += prob[j];
  }
  const double total = std::max(sum, row_mass);
  for (auto& v : prob) v = static_cast<float>(v / total);
  return (total - sum) / total;
}

// Keeps the candidates j with keep(j), in order.
template <typename Keep>
void filter(std::vector<int32_t>& ids, std::vector<float>& val, Keep keep) {
  size_t w = 0;
  for (size_t j = 0; j < ids.size(); ++j)
    if (keep(j)) {
      ids[w] = ids[j];
      val[w++] = val[j];
    }
  ids.resize(w);
  val.resize(w);
}

// Top-p as transformers' warper states it: order the candidates by logit ascending (equal
// logits in id order) and drop the longest prefix whose cumulative probability stays ≤ 1 − top_p,
// never the last (largest) token. Found from the top without sorting the candidates: a candidate
// is dropped when the mass of itself and everything ordered below it, the total less what ranks
// above, is ≤ 1 − top_p (the same rule; the sums differ from the ascending ones by rounding
// only). Candidates go into buckets of equal logit width from the largest logit down; whole
// buckets above the one where that tail mass reaches 1 − top_p are kept, those below dropped,
// and only that one bucket is ordered (larger logit first, equal logits larger id first: the
// ascending order reversed).
// `outside`: the probability of tokens that are not candidates, all ranked below every candidate.
void apply_top_p(std::vector<int32_t>& ids, std::vector<float>& val, const std::vector<float>& prob, double top_p,
                 double outside) {
  const size_t n = ids.size();
  const double drop_mass = 1.0 - top_p;
  constexpr int kBuckets = 4096;
  float mx = -std::numeric_limits<float>::infinity(), lo = std::numeric_limits<float>::infinity();
  for (float v : val) {
    mx = std::max(mx, v);
    if (std::isfinite(v)) lo = std::min(lo, v);
  }
  const double width = mx > lo ? (double(mx) - double(lo)) / kBuckets : 1.0;
  std::vector<double> mass(kBuckets, 0.0);
  std::vector<int> bucket(n);
  double total = outside;
  for (size_t j = 0; j < n; ++j) {
    const double d = (double(mx) - double(val[j])) / width;
    bucket[j] = d >= kBuckets - 1 || !std::isfinite(d) ? kBuckets - 1 : static_cast<int>(d);
    mass[bucket[j]] += prob[j];
    total += prob[j];
  }
  double above = 0;
  int edge = 0;
  for (; edge < kBuckets - 1 && total - above - mass[edge] > drop_mass; ++edge) above += mass[edge];
  std::vector<uint8_t> drop(n, 0);
  std::vector<int32_t> order;
  for (size_t j = 0; j < n; ++j) {
    if (bucket[j] > edge) drop[j] = 1;
    else if (bucket[j] == edge) order.push_back(static_cast<int32_t>(j));
  }
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return val[a] != val[b] ? val[a] > val[b] : a > b; });
  for (size_t r = 0; r < order.size(); ++r) {
    const bool top = edge == 0 && r == 0;  // the largest token always stays
    if (!top && total - above <= drop_mass) {
      for (size_t q = r; q < order.size(); ++q) drop[order[q]] = 1;
      break;
    }
    above += prob[order[r]];
  }
  filter(ids, val, [&](size_t j) { return !drop[j]; });
}

}  // namespace

TokenDistribution distribution_of_candidates(std::vector<int32_t> ids, std::vector<float> val,
                                             const SamplingParams& p, double row_mass) {
  std::vector<float> prob;
  if (p.top_p < 1.0 && !ids.empty()) {
    const double outside = candidate_softmax(val, prob, row_mass);
    apply_top_p(ids, val, prob, p.top_p, outside);
  }
  if (p.min_p > 0.0 && !ids.empty()) {
    candidate_softmax(val, prob);
    const float threshold = static_cast<float>(p.min_p) * *std::max_element(prob.begin(), prob.end());
    filter(ids, val, [&](size_t j) { return !(prob[j] < threshold); });
  }
  TokenDistribution d;
  candidate_softmax(val, d.probs);
  d.ids = std::move(ids);
  return d;
}

TokenDistribution token_distribution(const float* raw, int vocab, const SamplingParams& p, const TokenHistory& h) {
  std::vector<float> logits(raw, raw + vocab);
  apply_penalties(logits.data(), vocab, p, h);
  if (p.greedy()) return TokenDistribution{{argmax(logits.data(), vocab)}, {1.0f}};
  const float inv_t = static_cast<float>(1.0 / p.temperature);
  CandidateRow c;
  if (p.top_k > 0 && p.top_k < vocab) {
    select_top_k(logits.data(), vocab, p.top_k, inv_t, c);  // ties kept, as transformers does
  } else {
    c.ids.resize(vocab);
    std::iota(c.ids.begin(), c.ids.end(), 0);
    c.scaled.resize(vocab);
    for (int i = 0; i < vocab; ++i) c.scaled[i] = logits[i] * inv_t;
  }
  return distribution_of_candidates(std::move(c.ids), std::move(c.scaled), p);
}

float TokenDistribution::prob(int32_t id) const {
  const auto it = std::lower_bound(ids.begin(), ids.end(), id);
  return it != ids.end() && *it == id ? probs[size_t(it - ids.begin())] : 0.0f;
}

std::vector<float> TokenDistribution::dense(int vocab) const {
  std::vector<float> v(size_t(vocab), 0.0f);
  for (size_t j = 0; j < ids.size(); ++j) v[size_t(ids[j])] = probs[j];
  return v;
}

double SupportLaw::prob(int32_t id) const { return d_.prob(id); }

int32_t SupportLaw::draw(Rng& rng) const { return sample_from(d_, rng); }

int32_t SupportLaw::draw_excess_over(const TokenLaw& q_law, Rng& rng) const {
  const auto* q_support = dynamic_cast<const SupportLaw*>(&q_law);
  const TokenDistribution q_read = q_support ? TokenDistribution{} : q_law.support();
  const TokenDistribution& p = d_;
  const TokenDistribution& q = q_support ? q_support->d_ : q_read;
  TokenDistribution residual;
  residual.ids = p.ids;
  residual.probs.resize(p.ids.size());
  double mass = 0;
  size_t k = 0;
  for (size_t j = 0; j < p.ids.size(); ++j) {
    while (k < q.ids.size() && q.ids[k] < p.ids[j]) ++k;
    const float qj = k < q.ids.size() && q.ids[k] == p.ids[j] ? q.probs[k] : 0.0f;
    residual.probs[j] = std::max(0.0f, p.probs[j] - qj);
    mass += residual.probs[j];
  }
  return mass > 0 ? sample_from(residual, rng) : -1;
}

int32_t sample_from(const TokenDistribution& d, Rng& rng) {
  double total = 0;
  for (float v : d.probs) total += v;
  double u = rng.uniform() * total, acc = 0;
  int32_t last_nonzero = 0;
  for (size_t j = 0; j < d.ids.size(); ++j) {
    if (d.probs[j] <= 0) continue;
    acc += d.probs[j];
    last_nonzero = d.ids[j];
    if (u < acc) return d.ids[j];
  }
  return last_nonzero;
}

}  // namespace dflash
