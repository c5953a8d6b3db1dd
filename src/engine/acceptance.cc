#include "engine/acceptance.h"

#include <algorithm>

namespace dflash {

bool AcceptanceRule::accept(const std::vector<float>& p, const std::vector<float>& q, int32_t d, Rng& rng) const {
  if (q[d] <= 0.0f) return false;  // a token drawn from q has q(d) > 0
  return rng.uniform() < std::min(1.0, double(p[d]) / double(q[d]));
}

int32_t AcceptanceRule::replacement(const std::vector<float>& p, const std::vector<float>& q, Rng& rng) const {
  std::vector<float> residual(p.size());
  double mass = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    residual[i] = std::max(0.0f, p[i] - q[i]);
    mass += residual[i];
  }
  // p == q up to rounding: rejection had probability ~0, and p itself is the right law.
  return mass > 0 ? sample_from(residual, rng) : sample_from(p, rng);
}

const AcceptanceRule& exact_acceptance_rule() {
  static const AcceptanceRule rule;
  return rule;
}

}  // namespace dflash
