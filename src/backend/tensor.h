#pragma once
// A tensor is a 2-D row-major view (rows × cols, `ld` elements between rows) over memory
// owned by a backend. Multi-head data stays 2-D ([tokens, heads·head_dim]) and ops take the
// head size as an argument: this keeps every op's contract one line long and lets column
// slices (q/k/v of a fused projection, one layer's block of the context features) be views.
#include <cstdint>
#include <memory>
#include <string>

#include "util/dtype.h"

namespace dflash {

enum class DeviceKind { CPU, CUDA };

struct Tensor {
  std::shared_ptr<void> storage;  // keeps the allocation alive; views share it
  void* data = nullptr;
  DType dtype = DType::F32;
  DeviceKind device = DeviceKind::CPU;
  int64_t rows = 0, cols = 0, ld = 0;
  // A CPU bf16 weight stored in row panels (backend/cpu/bf16_panels.h): only ever used whole,
  // by the backend that made it.
  bool packed = false;
  // Made by Backend::upload_weight, and never written after: the CUDA products start reading
  // such a matrix before the kernel ahead of them has finished (backend/cuda/launch.cuh).
  bool weight = false;

  bool empty() const { return data == nullptr; }
  int64_t numel() const { return rows * cols; }
  bool contiguous() const { return ld == cols; }
  // Bytes of the elements (rows × cols; a packed weight's panel padding not counted).
  int64_t nbytes() const { return numel() * int64_t(dtype_size(dtype)); }

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }

  // Rows [begin, begin + count).
  Tensor slice_rows(int64_t begin, int64_t count) const {
    Tensor t = *this;
    t.data = static_cast<char*>(data) + begin * ld * dtype_size(dtype);
    t.rows = count;
    return t;
  }
  // Columns [begin, begin + count), all rows.
  Tensor slice_cols(int64_t begin, int64_t count) const {
    Tensor t = *this;
    t.data = static_cast<char*>(data) + begin * dtype_size(dtype);
    t.cols = count;
    return t;
  }
  std::string describe() const {
    return std::string(dtype_name(dtype)) + "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]" +
           (packed ? " (packed)" : "");
  }
};

}  // namespace dflash
