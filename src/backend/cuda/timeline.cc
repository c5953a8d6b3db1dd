#include "backend/cuda/timeline.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include "backend/cuda/cuda_common.h"

namespace dflash::cuda {
namespace {
std::vector<TimelineSetter>& setters() {
  static std::vector<TimelineSetter> s;
  return s;
}
}  // namespace

bool register_timeline_setter(TimelineSetter setter) {
  setters().push_back(setter);
  return true;
}

std::unique_ptr<Timeline> Timeline::from_env() {
  const char* path = std::getenv("DFLASH_CUDA_TIMELINE_OUT");
  if (!path || !*path) return nullptr;
  if (setters().empty()) {
    std::fprintf(stderr, "dflash: DFLASH_CUDA_TIMELINE_OUT is set but this build has no timeline "
                         "(configure with -DDFLASH_CUDA_TIMELINE=ON)\n");
    return nullptr;
  }
  uint64_t capacity = uint64_t(1) << 23;
  if (const char* c = std::getenv("DFLASH_CUDA_TIMELINE_RECORDS"); c && std::atoll(c) > 0) capacity = std::atoll(c);
  return std::make_unique<Timeline>(path, capacity);
}

Timeline::Timeline(std::string path, uint64_t capacity) : path_(std::move(path)), capacity_(capacity) {
  check(cudaMalloc(&records_, capacity_ * sizeof(TimelineRecord)), "timeline", "cudaMalloc");
  check(cudaMalloc(&ring_, sizeof(TimelineRing)), "timeline", "cudaMalloc");
  const TimelineRing host{0, capacity_, records_};
  check(cudaMemcpy(ring_, &host, sizeof host, cudaMemcpyHostToDevice), "timeline", "cudaMemcpy");
  for (TimelineSetter s : setters()) s(ring_);
  check(cudaDeviceSynchronize(), "timeline", "cudaDeviceSynchronize");
}

Timeline::~Timeline() {
  // Runs inside the backend's destructor: write what can be written, throw nothing.
  try {
    check(cudaDeviceSynchronize(), "timeline", "cudaDeviceSynchronize");
    for (TimelineSetter s : setters()) s(nullptr);
    TimelineRing host{};
    check(cudaMemcpy(&host, ring_, sizeof host, cudaMemcpyDeviceToHost), "timeline", "cudaMemcpy");
    const uint64_t n = host.next < capacity_ ? host.next : capacity_;
    std::vector<TimelineRecord> records(n);
    check(cudaMemcpy(records.data(), records_, n * sizeof(TimelineRecord), cudaMemcpyDeviceToHost), "timeline",
          "cudaMemcpy");
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    if (!f) throw Error("timeline: cannot write " + path_);
    const bool ok = std::fwrite(records.data(), sizeof(TimelineRecord), n, f) == n;
    std::fclose(f);
    if (!ok) throw Error("timeline: short write to " + path_);
    std::fprintf(stderr, "dflash timeline: %llu records to %s (%llu claimed, %llu dropped)\n",
                 static_cast<unsigned long long>(n), path_.c_str(), host.next,
                 host.next > capacity_ ? host.next - capacity_ : 0ull);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dflash timeline: %s\n", e.what());
  }
  cudaFree(records_);
  cudaFree(ring_);
}

}  // namespace dflash::cuda
