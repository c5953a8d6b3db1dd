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
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (p.top_k > 0 && p.top_k < vocab) {
    // Keep every token whose logit reaches the k-th largest (ties kept, as transformers does).
    std::vector<float> tmp(logits);
    std::nth_element(tmp.begin(), tmp.begin() + (p.top_k - 1), tmp.end(), std::greater<float>());
    const float kth = tmp[p.top_k - 1];
    for (auto& l : logits) if (l < kth) l = neg_inf;
  }
  auto softmax = [&](std::vector<float>& out) {
    const float mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (int i = 0; i < vocab; ++i) {
      out[i] = logits[i] == neg_inf ? 0.0f : std::exp(logits[i] - mx);
      sum += out[i];
    }
    for (auto& v : out) v = static_cast<float>(v / sum);
  };
  if (p.top_p < 1.0) {
    // Drop the low tail whose cumulative mass is at most 1 − top_p (the largest token always stays).
    softmax(probs);
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] < logits[b]; });
    double cum = 0;
    for (int i = 0; i < vocab - 1; ++i) {
      cum += probs[order[i]];
      if (cum <= 1.0 - p.top_p) logits[order[i]] = neg_inf;
      else break;
    }
  }
  if (p.min_p > 0.0) {
    softmax(probs);
    const float top = *std::max_element(probs.begin(), probs.end());
    const float threshold = static_cast<float>(p.min_p) * top;
    for (int i = 0; i < vocab; ++i) if (probs[i] < threshold) logits[i] = neg_inf;
  }
  softmax(probs);
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
