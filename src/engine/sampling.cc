#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_set>

#include "util/error.h"

namespace dflash {

void validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.0) || !std::isfinite(p.temperature)) throw Error("temperature must be >= 0");
  if (p.top_k < 0) throw Error("top_k must be >= 0");
  if (!(p.top_p > 0.0 && p.top_p <= 1.0)) throw Error("top_p must be in (0, 1]");
  if (!(p.min_p >= 0.0 && p.min_p <= 1.0)) throw Error("min_p must be in [0, 1]");
  if (!(p.repetition_penalty > 0.0)) throw Error("repetition_penalty must be > 0");
  if (!std::isfinite(p.presence_penalty)) throw Error("presence_penalty must be finite");
}

int32_t argmax(const float* v, int n) { return static_cast<int32_t>(std::max_element(v, v + n) - v); }

void apply_penalties(float* logits, int vocab, const SamplingParams& p, const TokenHistory& h) {
  if (p.repetition_penalty != 1.0) {
    std::unordered_set<int32_t> seen;
    auto mark = [&](int32_t t) { if (t >= 0 && t < vocab) seen.insert(t); };
    if (h.prompt) for (int32_t t : *h.prompt) mark(t);
    if (h.output) for (int32_t t : *h.output) mark(t);
    for (int i = 0; i < h.extra_count; ++i) mark(h.extra[i]);
    const float rp = static_cast<float>(p.repetition_penalty);
    for (int32_t t : seen) logits[t] = logits[t] < 0 ? logits[t] * rp : logits[t] / rp;
  }
  if (p.presence_penalty != 0.0) {
    std::unordered_set<int32_t> seen;
    if (h.output) for (int32_t t : *h.output) if (t >= 0 && t < vocab) seen.insert(t);
    for (int i = 0; i < h.extra_count; ++i) if (h.extra[i] >= 0 && h.extra[i] < vocab) seen.insert(h.extra[i]);
    for (int32_t t : seen) logits[t] -= static_cast<float>(p.presence_penalty);
  }
}

// The warpers keep a shrinking set of candidate tokens (ascending ids) instead of masking a
// vocabulary-sized row: after top-k only k (and ties) remain, so top-p, min-p and the softmax
// cost O(k), and top-p without top-k selects the nucleus instead of sorting the vocabulary
// (24 ms a row at 151 936 tokens on a 2-core host, a sampled DFlash step sorting 31 rows).
// A token outside the set has probability exactly 0, as it had as a masked logit, so sums over
// the set in ascending id order equal the masked row's sums.
namespace {

// Softmax over the candidates: exp(l − max) in f32, the sum in f64 in id order, each
// probability rounded to f32 (the masked row's arithmetic, term for term).
void candidate_softmax(const std::vector<float>& logits, const std::vector<int32_t>& cand, std::vector<float>& prob) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int32_t i : cand) mx = std::max(mx, logits[i]);
  double sum = 0;
  prob.resize(cand.size());
  for (size_t j = 0; j < cand.size(); ++j) {
    prob[j] = std::exp(logits[cand[j]] - mx);
    sum += prob[j];
  }
  for (auto& v : prob) v = static_cast<float>(v / sum);
}

// Top-p as transformers' warper states it: order the candidates by logit ascending (equal
// logits in id order), drop the longest prefix whose cumulative probability stays ≤ 1 − top_p,
// never the last (largest) token. Small sets are sorted whole and summed in that order. Large
// ones (top-p without top-k) find the nucleus from the top, where a candidate is dropped when
// the mass of itself and everything ordered below it, the total less what ranks above, is
// ≤ 1 − top_p (the same rule; the sums differ from the ascending ones by rounding only).
void apply_top_p(const std::vector<float>& logits, std::vector<int32_t>& cand, const std::vector<float>& prob,
                 double top_p) {
  const size_t n = cand.size();
  const double drop_mass = 1.0 - top_p;
  std::vector<uint8_t> drop(n, 0);
  if (n <= 8192) {
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[cand[a]] < logits[cand[b]]; });
    double cum = 0;
    for (size_t i = 0; i + 1 < n; ++i) {
      cum += prob[order[i]];
      if (cum > drop_mass) break;
      drop[order[i]] = 1;
    }
  } else {
    // Buckets of equal logit width, from the largest logit down: whole buckets above the one
    // where the tail mass reaches 1 − top_p are kept, those below dropped, and only that one
    // bucket is ordered (larger logit first, equal logits larger id first: the ascending order
    // reversed).
    constexpr int kBuckets = 4096;
    float mx = -std::numeric_limits<float>::infinity(), lo = std::numeric_limits<float>::infinity();
    for (int32_t i : cand) {
      mx = std::max(mx, logits[i]);
      if (std::isfinite(logits[i])) lo = std::min(lo, logits[i]);
    }
    const double width = mx > lo ? (double(mx) - double(lo)) / kBuckets : 1.0;
    auto bucket_of = [&](size_t j) {
      const double d = (double(mx) - double(logits[cand[j]])) / width;
      return d >= kBuckets - 1 || !std::isfinite(d) ? kBuckets - 1 : static_cast<int>(d);
    };
    std::vector<double> mass(kBuckets, 0.0);
    std::vector<int> bucket(n);
    double total = 0;
    for (size_t j = 0; j < n; ++j) {
      bucket[j] = bucket_of(j);
      mass[bucket[j]] += prob[j];
      total += prob[j];
    }
    double above = 0;
    int edge = 0;
    for (; edge < kBuckets - 1 && total - above - mass[edge] > drop_mass; ++edge) above += mass[edge];
    std::vector<int32_t> order;
    for (size_t j = 0; j < n; ++j) {
      if (bucket[j] > edge) drop[j] = 1;
      else if (bucket[j] == edge) order.push_back(static_cast<int32_t>(j));
    }
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      const float la = logits[cand[a]], lb = logits[cand[b]];
      return la != lb ? la > lb : a > b;
    });
    for (size_t r = 0; r < order.size(); ++r) {
      const bool top = edge == 0 && r == 0;  // the largest token always stays
      if (!top && total - above <= drop_mass) {
        for (size_t q = r; q < order.size(); ++q) drop[order[q]] = 1;
        break;
      }
      above += prob[order[r]];
    }
  }
  size_t w = 0;
  for (size_t j = 0; j < n; ++j) if (!drop[j]) cand[w++] = cand[j];
  cand.resize(w);
}

}  // namespace

std::vector<float> token_distribution(const float* raw, int vocab, const SamplingParams& p, const TokenHistory& h) {
  std::vector<float> logits(raw, raw + vocab);
  apply_penalties(logits.data(), vocab, p, h);
  std::vector<float> probs(vocab, 0.0f);
  if (p.greedy()) {
    probs[argmax(logits.data(), vocab)] = 1.0f;
    return probs;
  }
  const float inv_t = static_cast<float>(1.0 / p.temperature);
  for (auto& l : logits) l *= inv_t;
  std::vector<int32_t> cand;
  if (p.top_k > 0 && p.top_k < vocab) {
    // Every token whose logit reaches the k-th largest (ties kept, as transformers does). The
    // k largest are kept in a min-heap; most logits fail the comparison with its top.
    std::vector<float> heap(logits.begin(), logits.begin() + p.top_k);
    std::make_heap(heap.begin(), heap.end(), std::greater<float>());
    for (int i = p.top_k; i < vocab; ++i) {
      if (!(logits[i] > heap.front())) continue;
      std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
      heap.back() = logits[i];
      std::push_heap(heap.begin(), heap.end(), std::greater<float>());
    }
    const float kth = heap.front();
    for (int i = 0; i < vocab; ++i) if (logits[i] >= kth) cand.push_back(i);
  } else {
    cand.resize(vocab);
    std::iota(cand.begin(), cand.end(), 0);
  }
  std::vector<float> prob;
  if (p.top_p < 1.0) {
    candidate_softmax(logits, cand, prob);
    apply_top_p(logits, cand, prob, p.top_p);
  }
  if (p.min_p > 0.0) {
    candidate_softmax(logits, cand, prob);
    const float top = *std::max_element(prob.begin(), prob.end());
    const float threshold = static_cast<float>(p.min_p) * top;
    size_t w = 0;
    for (size_t j = 0; j < cand.size(); ++j) if (!(prob[j] < threshold)) cand[w++] = cand[j];
    cand.resize(w);
  }
  candidate_softmax(logits, cand, prob);
  for (size_t j = 0; j < cand.size(); ++j) probs[cand[j]] = prob[j];
  return probs;
}

int32_t sample_from(const std::vector<float>& probs, Rng& rng) {
  double total = 0;
  for (float v : probs) total += v;
  double u = rng.uniform() * total, acc = 0;
  int32_t last_nonzero = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    acc += probs[i];
    last_nonzero = static_cast<int32_t>(i);
    if (u < acc) return static_cast<int32_t>(i);
  }
  return last_nonzero;
}

}  // namespace dflash

namespace dflash {
int32_t choose_token(const float* logits, int vocab, const SamplingParams& p, const TokenHistory& h, Rng& rng) {
  if (p.greedy() && p.repetition_penalty == 1.0 && p.presence_penalty == 0.0) return argmax(logits, vocab);
  const auto probs = token_distribution(logits, vocab, p, h);
  return p.greedy() ? argmax(probs.data(), vocab) : sample_from(probs, rng);
}
}  // namespace dflash
