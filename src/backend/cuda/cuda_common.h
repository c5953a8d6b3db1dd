#pragma once
// Shared by the CUDA backend's files: error checks that name the op, and the launchers'
// common argument shapes. Compiled both by nvcc (.cu) and the host compiler (.cc).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "util/error.h"

namespace dflash::cuda {

// Every CUDA call is checked and reported with the op it served: a failure deep inside a
// forward pass is otherwise unplaceable, and later calls fail with a sticky, unrelated error.
inline void check(cudaError_t e, const char* op, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string("cuda ") + op + ": " + what + ": " + cudaGetErrorName(e) + " (" +
                cudaGetErrorString(e) + ")");
}

inline void check_blas(cublasStatus_t s, const char* op, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuda ") + op + ": " + what + ": cuBLAS status " + std::to_string(int(s)) + " (" +
                cublasGetStatusString(s) + ")");
}

// Every row of a row-major view starts on a 16-byte boundary (the 16-byte vector loads' need):
// an aligned base and a stride of whole 16-byte units.
inline bool rows_aligned16(const void* p, int64_t ld, int elem_bytes) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (ld * elem_bytes) % 16 == 0;
}

inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// Element types the kernels are instantiated for (the tensor's DType, as a small code).
enum class Elem { F32, BF16 };

}  // namespace dflash::cuda
