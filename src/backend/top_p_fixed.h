#pragma once
// The integers Backend::top_p_laws finds a top-p cut on, the same on the host and the device:
// each token's weight exp(scaled − max) ∈ [0, 1] fixed to a multiple of 2^-40 (a 151 936-token
// row sums to under 2^58), and the mass a dropped prefix may hold. Integer sums are exact in any
// order, so the device's histograms and the host's sorted walk meet the same boundary.
#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define DFLASH_HOST_DEVICE __host__ __device__
#else
#define DFLASH_HOST_DEVICE
#endif

namespace dflash {

DFLASH_HOST_DEVICE inline uint64_t top_p_fixed_weight(double w) {
  return static_cast<uint64_t>(llrint(w * 1099511627776.0));  // 2^40
}

// The most a dropped prefix may weigh: ⌊(1 − top_p) · total⌋.
DFLASH_HOST_DEVICE inline uint64_t top_p_drop_fixed(float top_p, uint64_t total) {
  return static_cast<uint64_t>(floor((1.0 - double(top_p)) * double(total)));
}

// Min-p's cut: the least scaled value s with exp(s − max) ≥ min_p, in f64 (the weight's own
// arithmetic), so that min-p keeps exactly the tokens whose weight reaches min_p of the largest;
// −inf without min-p. log() only gives the first guess; the steps to the neighbouring floats
// settle the boundary on exp() itself.
DFLASH_HOST_DEVICE inline float min_p_cut(float max, float min_p) {
  if (!(min_p > 0.f) || max == -INFINITY) return -INFINITY;
  const double target = double(min_p);
  auto reaches = [&](float s) { return exp(double(s) - double(max)) >= target; };
  float s = static_cast<float>(double(max) + log(target));
  while (!reaches(s)) s = nextafterf(s, INFINITY);
  for (float lower = nextafterf(s, -INFINITY); reaches(lower); lower = nextafterf(s, -INFINITY)) s = lower;
  return s;
}

}  // namespace dflash
