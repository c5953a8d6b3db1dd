#include "engine/acceptance.h"

#include <algorithm>

namespace dflash {

bool AcceptanceRule::accept(const TokenLaw& p, const TokenLaw& q, int32_t d, Rng& rng) const {
  const double qd = q.prob(d);
  if (!(qd > 0.0)) return false;  // a token drawn from q has q(d) > 0
  return rng.uniform() < std::min(1.0, p.prob(d) / qd);
}

int32_t AcceptanceRule::replacement(const TokenLaw& p, const TokenLaw& q, Rng& rng) const {
  const int32_t excess = p.draw_excess_over(q, rng);
  // p == q up to rounding: rejection had probability ~0, and p itself is the right law.
  return excess >= 0 ? excess : p.draw(rng);
}

const AcceptanceRule& exact_acceptance_rule() {
  static const AcceptanceRule rule;
  return rule;
}

}  // namespace dflash
