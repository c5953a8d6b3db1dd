#pragma once
// Shared by the CUDA backend's files: error checks that name the op, and the launchers'
// common argument shapes. Compiled both by nvcc (.cu) and the host compiler (.cc).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
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

// The current device's SM count; a failure names `op`.
inline int sm_count(const char* op) {
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), op, "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), op, "SM count");
  return sms;
}

// Owners of the buffers, events and streams the measuring code (doctor's probes, the copy
// bandwidth) makes for itself, released however it returns: its checks throw part-way.
class DeviceBuffer {
 public:
  DeviceBuffer(size_t bytes, const char* op) { check(cudaMalloc(&p_, bytes), op, "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(p_); }  // cudaFree waits for the device's work on it
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T = void>
  T* as() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
};

class Event {
 public:
  explicit Event(const char* op) { check(cudaEventCreate(&e_), op, "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  operator cudaEvent_t() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

class Stream {
 public:
  explicit Stream(const char* op) { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), op, "cudaStreamCreate"); }
  ~Stream() {
    cudaStreamSynchronize(s_);
    cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// The shortest of reps − 1 timings of `one_rep(rep)` on stream s, in ms between two events
// around it: the first rep only warms up (the measuring code's yardstick).
inline double best_event_ms(cudaStream_t s, int reps, const char* op, const std::function<void(int rep)>& one_rep) {
  const Event e0(op), e1(op);
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    check(cudaEventRecord(e0, s), op, "cudaEventRecord");
    one_rep(rep);
    check(cudaEventRecord(e1, s), op, "cudaEventRecord");
    check(cudaEventSynchronize(e1), op, "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0, e1), op, "cudaEventElapsedTime");
    if (rep > 0) best = std::min(best, double(ms));
  }
  return best;
}

// Element types the kernels are instantiated for (the tensor's DType, as a small code).
enum class Elem { F32, BF16 };

}  // namespace dflash::cuda
