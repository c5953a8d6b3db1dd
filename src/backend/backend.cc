#include "backend/backend.h"

#include "util/error.h"

namespace dflash {

FusedWeightShape fused_weight_shape(const std::vector<const TensorInfo*>& parts) {
  FusedWeightShape f;
  int64_t cols = -1;
  for (const auto* p : parts) {
    const int64_t r = p->shape.size() == 1 ? 1 : p->shape[0];
    const int64_t c = p->shape.size() == 1 ? p->shape[0] : p->numel() / p->shape[0];
    if (cols >= 0 && c != cols) throw Error("cannot fuse '" + p->name + "': column count differs");
    cols = c;
    f.rows += r;
    f.all_matrices = f.all_matrices && p->shape.size() == 2;
    f.all_bf16 = f.all_bf16 && p->dtype == DType::BF16;
  }
  f.cols = cols;
  return f;
}

}  // namespace dflash
