#pragma once
// What a model keeps for one sequence between forward calls. It lives with the model (not the
// engine) because only the model knows its layer kinds; the engine sees length() and
// truncate(), the two things the speculative loop needs.
#include <cstdint>
#include <string>
#include <vector>

#include "backend/tensor.h"
#include "util/error.h"

namespace dflash {

// One attention layer's keys and values, rows = positions, [capacity, kv_heads · head_dim].
struct KvCache {
  Tensor k, v;
};

class SequenceState {
 public:
  SequenceState() = default;
  SequenceState(std::vector<KvCache> kv, int64_t capacity) : kv_(std::move(kv)), capacity_(capacity) {}

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  KvCache& kv(size_t layer) { return kv_[layer]; }

  // Rollback after verification. Attention layers just forget rows past n. Recurrent layers
  // (hybrid models) will keep per-row snapshots beside kv_ and restore the one at n here.
  void truncate(int64_t n) {
    if (n < 0 || n > length_)
      throw Error("cannot truncate a sequence of " + std::to_string(length_) + " positions to " + std::to_string(n));
    length_ = n;
  }
  // Called by the model after it wrote `n` new rows.
  void advance(int64_t n) { length_ += n; }

 private:
  std::vector<KvCache> kv_;
  int64_t capacity_ = 0;
  int64_t length_ = 0;
};

}  // namespace dflash
