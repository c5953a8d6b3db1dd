#pragma once
// Speculative sampling's acceptance rule (contract section 5). It is an object so that a
// test can swap in a deliberately wrong rule and prove the distribution test notices.
#include <cstdint>

#include "engine/sampling.h"

namespace dflash {

class AcceptanceRule {
 public:
  virtual ~AcceptanceRule() = default;
  // Accept draft token d, drawn from q, against the target's p?
  virtual bool accept(const TokenLaw& p, const TokenLaw& q, int32_t d, Rng& rng) const;
  // The token that replaces a rejected draft.
  virtual int32_t replacement(const TokenLaw& p, const TokenLaw& q, Rng& rng) const;
};

// min(1, p(d)/q(d)) to accept; normalize(max(0, p − q)) on rejection.
const AcceptanceRule& exact_acceptance_rule();

}  // namespace dflash
