#pragma once
// Element types a checkpoint may store and a backend may compute in.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace dflash {

enum class DType { F32, F16, BF16, I32 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::I32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::I32: return "I32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
  }
  return "?";
}

inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as PyTorch does when it casts to bfloat16.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Converts n stored elements of type `t` to f32.
void convert_to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace dflash
