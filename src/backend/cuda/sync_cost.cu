// What one dependency between two steps of a decode pass costs on this device, with no work
// in the way: every step is a grid of blocks that reads a value another block wrote in the step
// before and writes its own. Five ways to order the steps:
// - a kernel per step, plain stream order;
// - a kernel per step with programmatic dependent launch, as the backend launches (the next
//   kernel resident and waiting in griddepcontrol.wait, launched once every block of the one
//   before has passed its own wait);
// - the same, each kernel released by the blocks of the one before counting themselves out
//   (KernelHandoff, below) instead of by the wait: what the wait itself costs;
// - the same as the second, each kernel letting the next one launch before it waits itself, so
//   that launches run ahead of the work: what launching costs;
// - one resident kernel for all steps, the steps separated by a grid barrier (each block counts
//   itself in with an atomic and waits until every block has).
// The barrier is what a persistent decode kernel would pay per dependency instead of a kernel
// boundary (docs/cuda.md, What remains), so the difference is the most such a design could save
// per boundary, before any overlap of work. Each way's result is checked, so a figure never
// comes from steps that ran out of order.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/launch.cuh"

namespace dflash::cuda {
namespace {

// One step: block b reads what block b + 1 wrote in the step before (from `in`) and writes
// its own value (to `out`); thread 0 does it, so the step is a dependency and nothing else.
__device__ __forceinline__ void step_body(const unsigned* in, unsigned* out, int step) {
  if (threadIdx.x == 0) {
    const unsigned next = (blockIdx.x + 1) % gridDim.x;
    out[blockIdx.x] = __ldcg(&in[next]) + unsigned(step);
  }
}

__global__ void step_kernel(const unsigned* in, unsigned* out, int step) {
  grid_dependency_begin();
  step_body(in, out, step);
}

// A hand-off between two kernels that skips the wait for the first one's grid to complete: the
// producer's blocks count themselves out on a counter once their last read and write is done
// (handoff_signal), and the consumer, resident early under PDL, waits for that count instead of
// griddepcontrol.wait. The consumer's last block to pass sets the counter back to zero. Whether
// the wait is what a boundary costs: on the H200 it is not (3.2-3.4 µs a step against the
// wait's 3.0-3.1, 2026-12-01), and neither is launching (the next kernel launched before the
// wait: no faster either); the split attention's merge released this way made plain decode 1 %
// slower, so the backend's kernels keep the wait (docs/benchmarks.md, nineteenth and twentieth
// passes).
struct KernelHandoff {
  unsigned* counter = nullptr;  // [0]: producer blocks done, [1]: consumer blocks passed
  unsigned producer_blocks = 0;
};

__device__ __forceinline__ unsigned load_acquire_gpu(const unsigned* p) {
  unsigned v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
  v = *reinterpret_cast<const volatile unsigned*>(p);
  __threadfence();
#endif
  return v;
}

// The producer's side, at its very end, reached by every thread of every block: the barrier
// orders the block's memory operations before thread 0's fence and count (as a grid barrier
// does). Null: no kernel waits for this one.
__device__ __forceinline__ void handoff_signal(unsigned* counter) {
  if (!counter) return;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
  }
}

// The consumer's side, in place of grid_dependency_begin(). After 4096 polls without the count
// (a bug, not a slow producer here) it falls back to the wait, so the order never rests on the
// counter alone; the result check in sync_costs would show a step run early.
__device__ __forceinline__ void handoff_wait(const KernelHandoff& h) {
  if (!h.counter) {
    grid_dependency_begin();
    return;
  }
  if (threadIdx.x == 0) {
    bool seen = false;
    for (int poll = 0; poll < (1 << 12) && !seen; ++poll) seen = load_acquire_gpu(h.counter) >= h.producer_blocks;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (!seen) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    if (atomicAdd(h.counter + 1, 1u) == gridDim.x - 1) {
      h.counter[0] = 0;
      h.counter[1] = 0;
      __threadfence();
    }
  }
  __syncthreads();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The trigger before the wait: the next kernel launches while this one still waits.
__global__ void early_step_kernel(const unsigned* in, unsigned* out, int step) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  step_body(in, out, step);
}

// Step i counts itself out on counters + 2·(i % 2) and waits for step i − 1 on the other pair.
__global__ void handoff_step_kernel(const unsigned* in, unsigned* out, int step, KernelHandoff wait_for,
                                    unsigned* signal) {
  handoff_wait(wait_for);
  step_body(in, out, step);
  handoff_signal(signal);
}

// Every step in one kernel; `arrived` starts at 0 and counts blocks through the barriers.
__global__ void barrier_kernel(unsigned* a, unsigned* b, unsigned* arrived, int steps) {
  for (int s = 0; s < steps; ++s) {
    step_body(s % 2 ? b : a, s % 2 ? a : b, s);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(arrived, 1u);
      const unsigned target = unsigned(s + 1) * gridDim.x;
      while (load_acquire_gpu(arrived) < target) {
      }
    }
    __syncthreads();
  }
}

float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0.f;
  check(cudaEventElapsedTime(&ms, a, b), "sync_costs", "cudaEventElapsedTime");
  return ms;
}

}  // namespace

SyncCosts sync_costs(int steps, int blocks_per_sm) {
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), "sync_costs", "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "sync_costs", "SM count");
  int coop = 0;
  check(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device), "sync_costs", "cooperative launch");
  SyncCosts r;
  r.blocks = sms * blocks_per_sm;
  r.steps = steps;
  const int threads = 256;
  // Declared buffer first: the stream's destructor waits for its work before the buffer goes.
  const size_t words = 2 * size_t(r.blocks) + 5;  // a, b, arrived, two hand-off counter pairs
  const DeviceBuffer buf_owner(sizeof(unsigned) * words, "sync_costs");
  unsigned* const buf = buf_owner.as<unsigned>();
  check(cudaMemset(buf, 0, sizeof(unsigned) * words), "sync_costs", "cudaMemset");
  unsigned *a = buf, *b = buf + r.blocks, *arrived = buf + 2 * r.blocks, *handoff = arrived + 1;
  const Stream s("sync_costs");
  const Event e0("sync_costs"), e1("sync_costs");

  // The best of three timed runs after a warm-up run, in µs per step.
  auto best_us = [&](auto&& run) {
    double best = 1e30;
    for (int rep = 0; rep < 4; ++rep) {
      check(cudaEventRecord(e0, s), "sync_costs", "cudaEventRecord");
      run();
      check(cudaEventRecord(e1, s), "sync_costs", "cudaEventRecord");
      check(cudaEventSynchronize(e1), "sync_costs", "cudaEventSynchronize");
      if (rep > 0) best = std::min(best, 1e3 * double(elapsed_ms(e0, e1)) / steps);
    }
    return best;
  };
  // Each way is also run once from zeroed buffers and its result checked: step i leaves every
  // block's value at 0 + 1 + … + i, so a step that read a value from before the step ahead of
  // it (the order broken) would leave less. A figure is printed only for an order that held.
  std::vector<unsigned> got(2 * size_t(r.blocks));
  const unsigned last = unsigned(steps - 1), want_last = last * (last + 1) / 2, want_prev = want_last - last;
  auto verified_us = [&](const char* way, auto&& run) {
    const double us = best_us(run);
    check(cudaMemsetAsync(buf, 0, sizeof(unsigned) * words, s), "sync_costs", "cudaMemsetAsync");
    run();
    check(cudaMemcpyAsync(got.data(), buf, got.size() * sizeof(unsigned), cudaMemcpyDeviceToHost, s), "sync_costs",
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(s), "sync_costs", "cudaStreamSynchronize");
    const unsigned* final_buf = got.data() + (last % 2 ? 0 : r.blocks);  // step i writes b when i is even
    const unsigned* prev_buf = got.data() + (last % 2 ? r.blocks : 0);
    for (int i = 0; i < r.blocks; ++i)
      if (final_buf[i] != want_last || (steps > 1 && prev_buf[i] != want_prev))
        throw Error(std::string("sync_costs: the steps ran out of order (") + way + ", block " + std::to_string(i) +
                    ": " + std::to_string(final_buf[i]) + ", expected " + std::to_string(want_last) + ")");
    return us;
  };
  r.stream_us = verified_us("stream order", [&] {
    for (int i = 0; i < steps; ++i) step_kernel<<<r.blocks, threads, 0, s>>>(i % 2 ? b : a, i % 2 ? a : b, i);
    check(cudaGetLastError(), "sync_costs", "kernel launch");
  });
  r.pdl_us = verified_us("programmatic dependent launch", [&] {
    for (int i = 0; i < steps; ++i)
      launch_kernel("sync_costs", step_kernel, r.blocks, threads, 0, s, i % 2 ? b : a, i % 2 ? a : b, i);
  });
  r.handoff_us = verified_us("hand-off counters", [&] {
    for (int i = 0; i < steps; ++i) {
      KernelHandoff wait_for;
      if (i > 0) wait_for = {handoff + 2 * ((i - 1) % 2), unsigned(r.blocks)};
      // The last step counts itself out nowhere: a count no step consumes would be left on its
      // pair for the next run, whose step 2 would then pass before step 1 is done.
      unsigned* signal = i + 1 < steps ? handoff + 2 * (i % 2) : nullptr;
      launch_kernel("sync_costs", handoff_step_kernel, r.blocks, threads, 0, s, i % 2 ? b : a, i % 2 ? a : b, i, wait_for,
                    signal);
    }
  });
  r.early_us = verified_us("launches ahead", [&] {
    for (int i = 0; i < steps; ++i)
      launch_kernel("sync_costs", early_step_kernel, r.blocks, threads, 0, s, i % 2 ? b : a, i % 2 ? a : b, i);
  });
  r.pdl = pdl_enabled();
  if (coop) {  // a cooperative launch fails rather than leave a block waiting for one never scheduled
    r.barrier_us = verified_us("grid barrier", [&] {
      check(cudaMemsetAsync(arrived, 0, sizeof(unsigned), s), "sync_costs", "cudaMemsetAsync");
      void* args[] = {&a, &b, &arrived, &steps};
      check(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(barrier_kernel), r.blocks, threads, args, 0, s),
            "sync_costs", "cooperative kernel launch");
    });
  }
  return r;
}

}  // namespace dflash::cuda
