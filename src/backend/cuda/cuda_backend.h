#pragma once
// What the CUDA build offers beyond the Backend interface: facts about the device for
// `dflash doctor` and the benchmark script. Declared only in builds with DFLASH_CUDA.
#include <cstddef>
#include <string>

namespace dflash::cuda {

// "NVIDIA H200, 132 SMs, 139.8 GiB, sm_90, driver 13.0" or "" when no GPU is visible.
std::string device_summary();
// Device-to-device copy bandwidth (bytes read + bytes written per second) over two buffers
// of `bytes` each, the best of several timed copies after a warm-up.
double copy_bandwidth(size_t bytes);
// Read-only streaming bandwidth (bytes read per second): `total` bytes read in launches of
// `window` bytes each, back to back, every launch reading memory no earlier one touched.
double read_bandwidth(size_t window, size_t total);
// The same, reading an [N, K] bf16 matrix the way the skinny product does (16 rows and 1/S of K
// a warp), `launches` matrices back to back.
double rows_read_bandwidth(int N, int K, int S, int launches);

}  // namespace dflash::cuda
