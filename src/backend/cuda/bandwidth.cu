// How fast this device streams memory into the SMs: the yardstick for the matrix products of a
// decode step, which read each weight once and write almost nothing. (copy_bandwidth, beside
// it in cuda_backend.cc, is the issue's roofline: a device-to-device copy.)
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_util.cuh"

namespace dflash::cuda {
namespace {

// Every 16-byte unit of p[0, n) read once, four loads in flight per thread; the xor of what was
// read goes to `sink` only in the never-taken case, so the loads stay.
__global__ void __launch_bounds__(256) read_kernel(const uint4* __restrict__ p, int64_t n, unsigned* sink) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = ld_stream_16(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = ld_stream_16(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// The skinny product's access pattern without its arithmetic (skinny_matmul.cu): a warp owns
// 16 rows of a [N, K] bf16 matrix and a K slice of 1/S, lane (g, t) reads 16 bytes of rows g and
// g + 8 at unit t + 4c of chunk c, four chunks a batch, the next batch issued before the
// current one is used. What streaming a weight this way can reach, beside read_kernel's.
__global__ void __launch_bounds__(256, 2) rows_kernel(const char* __restrict__ w, int N, int K, int S,
                                                      unsigned* sink) {
  constexpr int U = 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int G = 8 / S, group = warp % G, slice = warp / G;
  const int64_t n0 = (int64_t(blockIdx.x) * G + group) * 16;
  if (n0 >= N) return;
  const int chunks = K / 32, c_begin = slice * chunks / S, c_end = (slice + 1) * chunks / S;
  const uint4* r0 = reinterpret_cast<const uint4*>(w + (n0 + g) * int64_t(K) * 2) + t;
  const uint4* r1 = reinterpret_cast<const uint4*>(w + (n0 + 8 + g) * int64_t(K) * 2) + t;
  uint4 cur[U][2], next[U][2];
  auto load = [&](uint4 (&d)[U][2], int c) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cu = min(c + u, c_end - 1);
      d[u][0] = ld_stream_16(r0 + 4 * cu);
      d[u][1] = ld_stream_16(r1 + 4 * cu);
    }
  };
  uint32_t acc = 0;
  load(cur, c_begin);
  for (int c = c_begin; c < c_end; c += U) {
    if (c + U < c_end) load(next, c + U);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= cur[u][0].x ^ cur[u][1].y ^ cur[u][0].z ^ cur[u][1].w;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      cur[u][0] = next[u][0];
      cur[u][1] = next[u][1];
    }
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

}  // namespace

double rows_read_bandwidth(int N, int K, int S, int launches) {
  const size_t bytes = size_t(N) * size_t(K) * 2;
  void* buf = nullptr;
  unsigned* sink = nullptr;
  check(cudaMalloc(&buf, bytes * launches), "bandwidth", "cudaMalloc");
  check(cudaMalloc(&sink, sizeof(unsigned)), "bandwidth", "cudaMalloc");
  check(cudaMemset(buf, 0x5a, bytes * launches), "bandwidth", "cudaMemset");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "bandwidth", "cudaEventCreate");
  check(cudaEventCreate(&e1), "bandwidth", "cudaEventCreate");
  const unsigned blocks = unsigned((N / 16 + 8 / S - 1) / (8 / S));
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    check(cudaEventRecord(e0), "bandwidth", "cudaEventRecord");
    for (int l = 0; l < launches; ++l)
      rows_kernel<<<blocks, 256>>>(static_cast<const char*>(buf) + size_t(l) * bytes, N, K, S, sink);
    check(cudaGetLastError(), "bandwidth", "rows kernel launch");
    check(cudaEventRecord(e1), "bandwidth", "cudaEventRecord");
    check(cudaEventSynchronize(e1), "bandwidth", "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0, e1), "bandwidth", "cudaEventElapsedTime");
    if (rep > 0) best = std::max(best, double(bytes) * launches / (double(ms) * 1e-3));
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(sink);
  cudaFree(buf);
  return best;
}

double read_bandwidth(size_t window, size_t total) {
  window = std::max<size_t>(window / 16 * 16, 16);
  total = std::max(total / window, size_t(1)) * window;
  void* buf = nullptr;
  unsigned* sink = nullptr;
  check(cudaMalloc(&buf, total), "bandwidth", "cudaMalloc");
  check(cudaMalloc(&sink, sizeof(unsigned)), "bandwidth", "cudaMalloc");
  check(cudaMemset(buf, 0x5a, total), "bandwidth", "cudaMemset");
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), "bandwidth", "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "bandwidth", "SM count");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "bandwidth", "cudaEventCreate");
  check(cudaEventCreate(&e1), "bandwidth", "cudaEventCreate");
  const size_t windows = total / window;
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    // Each launch reads the next window, so a window smaller than L2 is still read from memory.
    check(cudaEventRecord(e0), "bandwidth", "cudaEventRecord");
    for (size_t w = 0; w < windows; ++w)
      read_kernel<<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(static_cast<char*>(buf) + w * window),
                                    int64_t(window / 16), sink);
    check(cudaGetLastError(), "bandwidth", "read kernel launch");
    check(cudaEventRecord(e1), "bandwidth", "cudaEventRecord");
    check(cudaEventSynchronize(e1), "bandwidth", "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0, e1), "bandwidth", "cudaEventElapsedTime");
    if (rep > 0) best = std::max(best, double(total) / (double(ms) * 1e-3));  // rep 0 warms up
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(sink);
  cudaFree(buf);
  return best;
}

}  // namespace dflash::cuda
