// The matrix products of a whole decode step as one stream of bulk copies (`dflash doctor`'s
// "products of a step" lines): what a persistent step whose products hand over to each other
// inside one kernel would read at, before anything is built on it (docs/cuda.md, What remains,
// item 0). The forty-fourth pass measured a product fed by bulk copies alone (bandwidth.cu,
// bulk_product_kernel): over the LM head's long stream it read faster than the backend's
// kernel, but the short products lost to their start, with the ring filled afresh at every
// launch. Here the ring runs on across products: a block issues the next product's weights as
// soon as a stage frees, whatever the products' dependencies, and only the arithmetic waits
// at the grid barrier between two products. Measuring code; no engine path uses it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cuda/bulk_ring.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kernels.h"

namespace dflash::cuda {
namespace {

// One product of the stream: y[M, N] = x[M, K] · w[N, K]ᵀ, written as one partial sum a stage
// of columns, part[ks][m][n] for ks < K / SK (the sums over ks run after the stream, in order).
struct StreamProduct {
  const __nv_bfloat16* w;
  float* part;
  int N, K;
};

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// A unit is a stage: 16 rows of w by SK columns. Product p's units u = tile · (K / SK) + ks are
// dealt to the blocks in turn (block b takes u = b, b + grid, …), so that a product of few
// tiles still spreads over every block. Each block walks its units of product 0, 1, … with
// one ring of ST stages kept in flight across them; BARRIERS: every block waits at a grid
// barrier after each product, as a step's products depend on each other (without: the
// stream's own rate). KS_MAJOR: units numbered column stage first (u = ks · tiles + tile), so
// that a block's consecutive units of a product mostly share their stage of x, which the warps
// then keep in registers instead of reading it from L2 again (at 16 rows x's bytes a unit
// equal w's).
template <int SK, int ST, bool BARRIERS, bool KS_MAJOR>
__global__ void __launch_bounds__(256, 2) step_stream_kernel(const StreamProduct* __restrict__ products, int P,
                                                             const __nv_bfloat16* __restrict__ x, int64_t ldx,
                                                             int M, unsigned* arrived, unsigned* stuck) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kPitch = bulk_row_pitch<SK>(), kStageBytes = kBulkRows * kPitch;
  constexpr int kWarpChunks = SK / 32 / 8;
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) uint64_t landed[ST];
  __shared__ float part[8][16][16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t G = gridDim.x, b = blockIdx.x;
  auto units_of = [&](const StreamProduct& q) -> int64_t {
    const int64_t U = int64_t(q.N / kBulkRows) * (q.K / SK);
    return U > b ? (U - b + G - 1) / G : 0;
  };
  ring_init(landed);

  // The issuer's place in the block's units (thread 0 only), ahead of the arithmetic by ST.
  int ip = 0;
  int64_t ii = 0, in = 0;
  StreamProduct iq{};
  auto issue_next = [&](int64_t j) {  // copy j of the block: the issuer's current unit, then on
    while (ii >= in && ip < P) {
      iq = products[ip++];
      in = units_of(iq);
      ii = 0;
    }
    if (ii >= in) return;
    const int S = iq.K / SK;
    const int64_t u = b + ii * G;
    const int64_t tiles = iq.N / kBulkRows;
    const int64_t row0 = (KS_MAJOR ? u % tiles : u / S) * kBulkRows, k0 = int64_t(KS_MAJOR ? u / tiles : u % S) * SK;
    const int s = int(j % ST);
    unsigned char* stage = ring + s * kStageBytes;
    ring_expect(&landed[s], kBulkRows * SK * 2);
    for (int r = 0; r < kBulkRows; ++r) ring_copy(stage + r * kPitch, &landed[s], iq.w + (row0 + r) * iq.K + k0, SK * 2);
    ++ii;
  };
  const bool issuer = threadIdx.x == 0;
  if (issuer)
    for (int64_t j = 0; j < ST; ++j) issue_next(j);

  const bool in0 = g < M, in1 = g + 8 < M;
  const __nv_bfloat16* xrow0 = x + int64_t(in0 ? g : 0) * ldx;
  const __nv_bfloat16* xrow1 = x + int64_t(in1 ? g + 8 : 0) * ldx;
  int64_t j = 0;  // the block's copies consumed so far
  for (int p = 0; p < P; ++p) {
    const StreamProduct q = products[p];
    const int64_t n = units_of(q);
    const int S = q.K / SK;
    const int64_t tiles = q.N / kBulkRows;
    uint4 a[kWarpChunks][2];  // x for the warp's chunks of stage a_ks, loaded before the wait
    int a_ks = -1;
    for (int64_t i = 0; i < n; ++i, ++j) {
      const int64_t u = b + i * G;
      const int64_t tile = KS_MAJOR ? u % tiles : u / S;
      const int ks = int(KS_MAJOR ? u / tiles : u % S);
      const int s = int(j % ST);
      if (ks != a_ks) {
#pragma unroll
        for (int cc = 0; cc < kWarpChunks; ++cc) {
          const int64_t col = int64_t(ks) * SK + (kWarpChunks * warp + cc) * 32 + t * 8;
          a[cc][0] = in0 ? __ldg(reinterpret_cast<const uint4*>(xrow0 + col)) : make_uint4(0, 0, 0, 0);
          a[cc][1] = in1 ? __ldg(reinterpret_cast<const uint4*>(xrow1 + col)) : make_uint4(0, 0, 0, 0);
        }
        a_ks = ks;
      }
      ring_wait(&landed[s], uint32_t(j / ST) & 1u);
      const unsigned char* stage = ring + s * kStageBytes;
      float acc[2][4] = {};
      bulk_stage_mma<SK>(stage, a, acc, warp, g, t);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[warp][g + (e / 2) * 8][nt * 8 + 2 * t + e % 2] = acc[nt][e];
      __syncthreads();  // every warp is past stage s (it may be refilled) and has left its sums
      if (issuer) issue_next(j + ST);
      for (int e = threadIdx.x; e < M * kBulkRows; e += 256) {
        const int m = e / kBulkRows, col = e % kBulkRows;
        float sum = part[0][m][col];
        for (int v = 1; v < 8; ++v) sum += part[v][m][col];
        q.part[(int64_t(ks) * M + m) * q.N + tile * kBulkRows + col] = sum;
      }
      __syncthreads();  // part is written again by the next unit
    }
    if constexpr (BARRIERS) {
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(arrived, 1u);
        const unsigned target = unsigned(p + 1) * unsigned(G);
        // A bound on the polls, so that a bug shows as a flag rather than a hung device.
        for (long polls = 0; load_acquire(arrived) < target; ++polls)
          if (polls > (1l << 24)) {
            atomicExch(stuck, 1u);
            break;
          }
      }
      __syncthreads();
    }
  }
#else
  (void)products, (void)P, (void)x, (void)ldx, (void)M, (void)arrived, (void)stuck;
  __trap();
#endif
}

// Deterministic bf16 values in [-1, 1) from an index: the weights and x of the probe.
__global__ void fill_bf16_kernel(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t v = uint32_t(i) * 2654435761u ^ seed ^ uint32_t(i >> 32) * 40503u;
    v ^= v >> 15;
    v *= 2246822519u;
    v ^= v >> 13;
    p[i] = __float2bfloat16(float(int32_t(v >> 8) - (1 << 23)) / float(1 << 23));
  }
}

}  // namespace

StepStreamRates step_stream_probe(int M, int layers, double copy_gbs) {
  constexpr int kSK = 1024, kST = 3;
  StepStreamRates r;
  r.M = M, r.layers = layers;
  if (M < 1 || M > 16 || layers < 1) return r;
  int device = 0, coop = 0;
  check(cudaGetDevice(&device), "step stream", "cudaGetDevice");
  check(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device), "step stream", "cooperative launch");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "step stream", "cudaGetDeviceProperties");
  if (!coop || prop.major < 9) return r;

  // Qwen3-8B's products, layer by layer (q/k/v, o, gate/up, down), then the LM head.
  struct Shape {
    int N, K;
  };
  const Shape layer[4] = {{6144, 4096}, {4096, 4096}, {24576, 4096}, {4096, 12288}};
  const Shape head{151936, 4096};
  std::vector<Shape> shapes;
  for (int l = 0; l < layers; ++l) shapes.insert(shapes.end(), layer, layer + 4);
  shapes.push_back(head);
  const int P = int(shapes.size());
  size_t w_elems = 0;
  for (const auto& s : shapes) w_elems += size_t(s.N) * s.K;
  r.weight_bytes = double(w_elems) * 2;
  r.products = P;

  const DeviceBuffer w(w_elems * 2, "step stream"), x(size_t(M) * 12288 * 2, "step stream");
  fill_bf16_kernel<<<1024, 256>>>(w.as<__nv_bfloat16>(), int64_t(w_elems), 0x1234567u);
  fill_bf16_kernel<<<64, 256>>>(x.as<__nv_bfloat16>(), int64_t(M) * 12288, 0x89abcdu);
  check(cudaGetLastError(), "step stream", "fill");
  check(cudaDeviceSynchronize(), "step stream", "fill");  // the probe's own stream does not wait for the default one
  // Outputs: one of each layer product and the head for the backend's kernel; the stream's
  // partials for the same (a layer's products overwrite the layer before's, as the backend's do).
  const size_t y_elems = size_t(M) * head.N;
  size_t part_elems = 0;
  for (int k = 0; k < 5; ++k) {
    const Shape s = k < 4 ? layer[k] : head;
    part_elems = std::max(part_elems, size_t(s.K / kSK) * M * s.N);
  }
  const DeviceBuffer y_loads(y_elems * 4 * 5, "step stream"), parts(part_elems * 4 * 5, "step stream");
  const DeviceBuffer descs(sizeof(StreamProduct) * P, "step stream"), counters(8, "step stream");
  std::vector<StreamProduct> host(P);
  std::vector<const __nv_bfloat16*> wp(P);
  {
    size_t at = 0;
    for (int i = 0; i < P; ++i) {
      const int kind = i == P - 1 ? 4 : i % 4;
      wp[i] = w.as<__nv_bfloat16>() + at;
      host[i] = {wp[i], parts.as<float>() + part_elems * kind, shapes[i].N, shapes[i].K};
      at += size_t(shapes[i].N) * shapes[i].K;
    }
  }
  check(cudaMemcpy(descs.as(), host.data(), sizeof(StreamProduct) * P, cudaMemcpyHostToDevice), "step stream",
        "cudaMemcpy");

  // Ways 1-4 (StepStreamRates): with barriers, without, and the two again column stage first.
  constexpr decltype(&step_stream_kernel<kSK, kST, true, false>) kernels[5] = {
      nullptr, step_stream_kernel<kSK, kST, true, false>, step_stream_kernel<kSK, kST, false, false>,
      step_stream_kernel<kSK, kST, true, true>, step_stream_kernel<kSK, kST, false, true>};
  constexpr int ring = bulk_ring_bytes<kSK, kST>();
  int per_sm = 0;
  for (int way = 1; way < 5; ++way)
    check(cudaFuncSetAttribute(kernels[way], cudaFuncAttributeMaxDynamicSharedMemorySize, ring), "step stream",
          "cudaFuncSetAttribute");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernels[1], 256, ring), "step stream", "occupancy");
  if (per_sm < 1) return r;
  r.blocks = std::min(per_sm, 2) * prop.multiProcessorCount;

  const Stream s("step stream");
  const auto* xp = x.as<const __nv_bfloat16>();
  const StreamProduct* dp = descs.as<const StreamProduct>();
  unsigned* arrived = counters.as<unsigned>();
  unsigned* stuck = arrived + 1;
  check(cudaMemsetAsync(stuck, 0, 4, s), "step stream", "cudaMemsetAsync");
  int64_t ldx = 12288;
  auto run = [&](int way) {
    if (way == 0) {
      for (int i = 0; i < P; ++i) {
        const int kind = i == P - 1 ? 4 : i % 4;
        skinny_matmul(xp, ldx, wp[i], shapes[i].K, y_loads.as<float>() + y_elems * kind, shapes[i].N, Elem::F32, M,
                      shapes[i].N, shapes[i].K, false, true, s);
      }
    } else {
      check(cudaMemsetAsync(arrived, 0, 4, s), "step stream", "cudaMemsetAsync");
      int m = M, p = P;
      void* args[] = {&dp, &p, &xp, &ldx, &m, &arrived, &stuck};
      check(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kernels[way]),
                                        unsigned(r.blocks), 256u, args, size_t(ring), s),
            "step stream", "cooperative kernel launch");
    }
    check(cudaGetLastError(), "step stream", "kernel launch");
  };
  auto time_ms = [&](int way) { return best_event_ms(s, 4, "step stream", [&](int) { run(way); }); };
  for (int round = 0; round < 2; ++round)  // alternating, so that no way gets the warmer device
    for (int way = 0; way < 5; ++way) r.ms[way] = std::min(round ? r.ms[way] : 1e30, time_ms(way));
  unsigned was_stuck = 0;
  check(cudaMemcpy(&was_stuck, stuck, 4, cudaMemcpyDeviceToHost), "step stream", "cudaMemcpy");
  r.stuck = was_stuck != 0;

  // The stream's partial sums added in order, against the backend's outputs of the last layer's
  // products and the head (the last way run was a stream's; they all write alike).
  std::vector<float> ref, got;
  for (int kind = 0; kind < 5; ++kind) {
    const Shape sh = kind < 4 ? layer[kind] : head;
    const int S = sh.K / kSK;
    ref.resize(size_t(M) * sh.N);
    got.assign(size_t(S) * M * sh.N, 0.f);
    check(cudaMemcpy(ref.data(), y_loads.as<float>() + y_elems * kind, ref.size() * 4, cudaMemcpyDeviceToHost),
          "step stream", "cudaMemcpy");
    check(cudaMemcpy(got.data(), parts.as<float>() + part_elems * kind, got.size() * 4, cudaMemcpyDeviceToHost),
          "step stream", "cudaMemcpy");
    double diff = 0, scale = 0;
    for (size_t e = 0; e < ref.size(); ++e) {
      float sum = 0.f;
      for (int ks = 0; ks < S; ++ks) sum += got[size_t(ks) * ref.size() + e];
      diff = std::max(diff, double(std::fabs(sum - ref[e])));
      scale = std::max(scale, double(std::fabs(ref[e])));
    }
    r.max_rel_diff = std::max(r.max_rel_diff, scale > 0 ? diff / scale : diff);
  }
  for (int way = 0; way < 5; ++way) {
    r.gbs[way] = r.weight_bytes / (r.ms[way] * 1e6);
    r.of_copy[way] = copy_gbs > 0 ? r.gbs[way] / copy_gbs : 0;
  }
  r.ran = true;
  return r;
}

}  // namespace dflash::cuda
