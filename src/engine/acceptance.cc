#include "engine/acceptance.h"

#include <algorithm>

namespace dflash {

bool AcceptanceRule::accept(const TokenDistribution& p, const TokenDistribution& q, int32_t d, Rng& rng) const {
  const float qd = q.prob(d);
  if (qd <= 0.0f) return false;  // a token drawn from q has q(d) > 0
  return rng.uniform() < std::min(1.0, double(p.prob(d)) / double(qd));
}

int32_t AcceptanceRule::replacement(const TokenDistribution& p, const TokenDistribution& q, Rng& rng) const {
  // max(0, p − q) is 0 wherever p is, so its support is within p's: one merge walk of the two
  // ascending supports.
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
  // p == q up to rounding: rejection had probability ~0, and p itself is the right law.
  return mass > 0 ? sample_from(residual, rng) : sample_from(p, rng);
}

const AcceptanceRule& exact_acceptance_rule() {
  static const AcceptanceRule rule;
  return rule;
}

}  // namespace dflash
