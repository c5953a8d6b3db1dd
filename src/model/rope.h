#pragma once
// Rotary position embedding tables, computed the way transformers computes them (inverse
// frequencies and angles in float32) for the default, linear, yarn and llama3 types.
#include <cstdint>
#include <string>
#include <vector>

#include "io/config.h"

namespace dflash {

class RopeTable {
 public:
  RopeTable() = default;
  // Throws dflash::Error, naming `source` (the config file), when the parameters give a
  // frequency or scale that is not a finite number: transformers would rotate by NaN there.
  RopeTable(const RopeConfig& config, int head_dim, const std::string& source = "rope");

  int head_dim() const { return head_dim_; }
  float attention_scaling() const { return attention_scaling_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  // Grows the tables to cover positions 0 … n − 1.
  void ensure(int64_t n);
  int64_t size() const { return size_; }
  // cos/sin of position p, head_dim / 2 values each, already multiplied by attention_scaling.
  const float* cos(int64_t p) const { return cos_.data() + p * (head_dim_ / 2); }
  const float* sin(int64_t p) const { return sin_.data() + p * (head_dim_ / 2); }

 private:
  int head_dim_ = 0;
  float attention_scaling_ = 1.0f;
  std::vector<float> inv_freq_;
  std::vector<float> cos_, sin_;
  int64_t size_ = 0;
};

}  // namespace dflash
