#include "util/dtype.h"

#include "util/error.h"

namespace dflash {

void convert_to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::BF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::I32:
      break;
  }
  throw Error(std::string("cannot convert dtype ") + dtype_name(t) + " to F32");
}

}  // namespace dflash
