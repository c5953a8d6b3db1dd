#pragma once
// The CUDA backend's argument checks, shared by the files that implement its ops (host code):
// each error names the op and the tensor. And the shapes the profiler files an op under.
#include <cstdint>
#include <string>

#include "backend/tensor.h"
#include "util/error.h"

namespace dflash::cuda {

inline void expect_device(const Tensor& t, const char* op, const char* what) {
  if (t.device != DeviceKind::CUDA)
    throw Error(std::string("cuda ") + op + ": " + what + " is not a CUDA tensor (" + t.describe() + ")");
}

inline void expect(const Tensor& t, DType dt, const char* op, const char* what) {
  expect_device(t, op, what);
  if (t.dtype != dt)
    throw Error(std::string("cuda ") + op + ": " + what + " must be " + dtype_name(dt) + ", got " + t.describe());
}

inline std::string dims(int64_t a, int64_t b) { return std::to_string(a) + "x" + std::to_string(b); }
inline std::string dims(const Tensor& t) { return dims(t.rows, t.cols) + " " + dtype_name(t.dtype); }

}  // namespace dflash::cuda
