#include "model/rope.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace dflash {

namespace {
constexpr double kPi = 3.14159265358979323846;

double yarn_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}
}  // namespace

RopeTable::RopeTable(const RopeConfig& c, int head_dim, const std::string& source) : head_dim_(head_dim) {
  const int half = head_dim / 2;
  inv_freq_.resize(half);
  const float base = static_cast<float>(c.theta);
  // float32 exponent and power, as torch computes `base ** (arange(0, dim, 2) / dim)`.
  std::vector<float> pos_freqs(half);
  for (int i = 0; i < half; ++i)
    pos_freqs[i] = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  for (int i = 0; i < half; ++i) inv_freq_[i] = 1.0f / pos_freqs[i];

  if (c.type == "linear") {
    for (auto& f : inv_freq_) f = f / static_cast<float>(c.factor);
  } else if (c.type == "llama3") {
    const double old_ctx = c.original_max_position_embeddings;
    const double low_wavelen = old_ctx / c.low_freq_factor;
    const double high_wavelen = old_ctx / c.high_freq_factor;
    for (auto& f : inv_freq_) {
      const float wavelen = static_cast<float>(2 * kPi) / f;
      const float scaled = f / static_cast<float>(c.factor);
      if (wavelen > low_wavelen) {
        f = scaled;
      } else if (wavelen >= high_wavelen) {  // medium band: interpolate smoothly
        const float smooth = static_cast<float>((old_ctx / wavelen - c.low_freq_factor) /
                                                (c.high_freq_factor - c.low_freq_factor));
        f = (1 - smooth) * scaled + smooth * f;
      }
    }
  } else if (c.type == "yarn") {
    const double factor = c.factor;
    if (c.attention_factor) {
      attention_scaling_ = static_cast<float>(*c.attention_factor);
    } else if (c.mscale && c.mscale_all_dim && *c.mscale != 0 && *c.mscale_all_dim != 0) {
      attention_scaling_ = static_cast<float>(yarn_mscale(factor, *c.mscale) / yarn_mscale(factor, *c.mscale_all_dim));
    } else {
      attention_scaling_ = static_cast<float>(yarn_mscale(factor, 1.0));
    }
    auto correction_dim = [&](double rotations) {
      return (head_dim * std::log(c.original_max_position_embeddings / (rotations * 2 * kPi))) /
             (2 * std::log(c.theta));
    };
    double low = correction_dim(c.beta_fast), high = correction_dim(c.beta_slow);
    if (c.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(head_dim - 1));
    if (low == high) high += 0.001;
    for (int i = 0; i < half; ++i) {
      const float ramp = std::clamp(static_cast<float>((i - low) / (high - low)), 0.0f, 1.0f);
      const float extrapolation_weight = 1.0f - ramp;
      const float interpolated = 1.0f / (static_cast<float>(factor) * pos_freqs[i]);
      const float extrapolated = 1.0f / pos_freqs[i];
      inv_freq_[i] = interpolated * (1 - extrapolation_weight) + extrapolated * extrapolation_weight;
    }
  }
  const bool finite = std::isfinite(attention_scaling_) &&
                      std::all_of(inv_freq_.begin(), inv_freq_.end(), [](float f) { return std::isfinite(f); });
  if (!finite)
    throw Error(source + ": the RoPE parameters (" + c.describe() +
                ") give rotation frequencies that are not finite numbers at head_dim " + std::to_string(head_dim));
}

void RopeTable::ensure(int64_t n) {
  if (n <= size_) return;
  const int half = head_dim_ / 2;
  const int64_t grown = std::max<int64_t>(n, size_ * 2);
  cos_.resize(grown * half);
  sin_.resize(grown * half);
  for (int64_t p = size_; p < grown; ++p) {
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * inv_freq_[i];  // float32 product, as torch
      cos_[p * half + i] = static_cast<float>(std::cos(angle)) * attention_scaling_;
      sin_[p * half + i] = static_cast<float>(std::sin(angle)) * attention_scaling_;
    }
  }
  size_ = grown;
}

}  // namespace dflash
