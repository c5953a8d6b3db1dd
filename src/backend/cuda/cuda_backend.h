#pragma once
// What the CUDA build offers beyond the Backend interface: facts about the device for
// `dflash doctor` and the benchmark script. Declared only in builds with DFLASH_CUDA.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace dflash {
class Backend;
struct Tensor;
struct NormedRows;
}

namespace dflash::cuda {

// "NVIDIA H200, 132 SMs, 139.8 GiB, sm_90, driver 13.0" or "" when no GPU is visible.
std::string device_summary();
// Whether `b` (a CUDA backend) keeps a pre-tiled copy of weight w for the skinny products
// (DFLASH_CUDA_TILED_WEIGHTS=1 when it was made): what the GPU test of that path checks first.
bool has_tiled_copy(const Backend& b, const Tensor& w);
// Whether `b` (a CUDA backend) runs matmul_normed_argmax over rows h (bf16, a deferred norm's) and
// weight w choosing inside the product's kernel (unless DFLASH_FUSED_ARGMAX=0 when it was made;
// the GPU test of that path checks first that it does).
bool fuses_argmax(const Backend& b, const Tensor& h, const Tensor& w);
// Whether `b` (a CUDA backend) runs embed_normed / embed_rows_normed into x and out.h as one
// launch (embed_norm_emit) for this table and norm (unless DFLASH_FUSED_EMBED_NORM=0 when it was
// made; the GPU test of that path checks first).
bool fuses_embed_norm(const Backend& b, const Tensor& table, const Tensor& x, const Tensor& norm_w,
                      const NormedRows& out);
// Whether `b` (a CUDA backend) stores matmul_add_norm's x_copy from the product's epilogue
// (unless DFLASH_FEATURES_FROM_EPILOGUE=0 when it was made) where the fused product runs.
bool features_in_epilogue(const Backend& b);
// Device-to-device copy bandwidth (bytes read + bytes written per second) over two buffers
// of `bytes` each, the best of several timed copies after a warm-up.
double copy_bandwidth(size_t bytes);
// Bytes per second of the fastest of `reps` event-timed runs of `one_rep(rep)` on the default
// stream, each moving `bytes`; run 0 warms up and is not counted. (The timing loop of
// copy_bandwidth and of the read measurements in bandwidth.cu.)
double best_timed_rate(int reps, double bytes, const std::function<void(int rep)>& one_rep);
// Read-only streaming bandwidth (bytes read per second): `total` bytes read in launches of
// `window` bytes each, back to back, every launch reading memory no earlier one touched.
// flavour: 0 the products' 16-byte load (read-only, no L1 allocation, 256-byte L2 prefetch), 1
// without the prefetch, 2 a plain read-only load, 3 with an evict-first L2 policy; `unroll`
// (4, or 8 with flavour 0 only) loads in flight per thread; blocks_per_sm blocks of 256 threads
// per SM. Flavours 4, 5, 6: bulk copies (cp.async.bulk) into shared-memory rings of 4 × 16 KiB,
// 3 × 32 KiB and 8 × 8 KiB tiles (`unroll` unused).
double read_bandwidth(size_t window, size_t total, int flavour = 0, int unroll = 4, int blocks_per_sm = 8);
// The same, reading an [N, K] bf16 matrix the way the skinny product does (rows and 1/S of K a
// warp), `launches` matrices back to back. variant: 0 16 rows, 4 chunks a batch (the kernel's
// two-tile pattern); 1 8 rows, 8 chunks (its one-tile pattern); 2 8 rows, 4 chunks; 3, 4, 5
// through shared memory with coalesced cp.async (4 chunks 3 stages, 8 chunks 3 stages, 4
// chunks 4 stages; 4-warp blocks); 6, 7, 8 variant 0 with the load flavours 1, 2, 3 of
// read_bandwidth; 9 variant 0 with a warp's two groups of 8 rows N / 2 apart (the gate/up pattern).
double rows_read_bandwidth(int N, int K, int S, int launches, int variant);
// Microseconds to read `bytes` once (the best of five) after L2 was flushed and then, by mode:
// 0 nothing; 1 a bulk prefetch into L2 (as the products stage a weight) and a 50 µs pause;
// 2 a per-line prefetch (evict_last) and the pause; 3 a read and the pause (L2 holds what it
// can); 4 a bulk prefetch launched right before the read.
double l2_stage_probe(size_t bytes, int mode);

// What a release costs a block that streams a weight (bandwidth.cu): `bytes` read in 256 KiB
// tiles by two blocks an SM, thread 0 raising a counter after each tile, with and without a
// `fence.acq_rel.gpu` before it; by 16-byte loads (the next tile's first batch in flight at the
// release, as in the skinny products) and by bulk copies into a shared-memory ring (three
// copies in flight). GB/s each way, and the µs each release added to its block. rows_gbs: the
// 16-byte loads without releases, each tile read in the gate/up product's row pattern.
struct ReleaseCosts {
  int blocks = 0, tile_bytes = 0;
  double releases_per_block = 0;
  double loads_gbs = 0, loads_release_gbs = 0, bulk_gbs = 0, bulk_release_gbs = 0, rows_gbs = 0;
  double loads_release_us = 0, bulk_release_us = 0;
};
ReleaseCosts release_probe(size_t bytes);

// A skinny product fed by bulk copies into a shared-memory ring (bandwidth.cu) against the
// backend's 16-byte-load kernel on the same [N, K] weights and M rows (M ≤ 16, N % 16 == 0,
// K % 1024 == 0; `ran` false otherwise). Ways: 0 the backend's kernel; 1 stages of 512 columns
// (1 KiB a row, one copy each), four in the ring, thread 0 issuing a stage's 16 copies; 2 the
// same, 16 lanes issuing them at once; 3 stages of 1024 columns, three in the ring, 16 lanes.
// µs a product and GB/s of weights, each the best of several reps of `launches` weights read
// back to back, and the largest difference between a bulk way's output and the backend's over
// the backend's largest output (their sums run in different orders).
struct BulkProductRates {
  int M = 0, N = 0, K = 0, launches = 0;
  bool ran = false;
  double us[4] = {}, gbs[4] = {};
  double max_rel_diff = 0;
};
BulkProductRates bulk_product_probe(int M, int N, int K);

// A decode step's matrix products (Qwen3-8B: q/k/v, o, gate/up and down for `layers` layers,
// then the LM head) on M rows, three ways over the same weights (step_stream_probe.cu): 0 the
// backend's kernel launched a product at a time; 1 one cooperative kernel streaming every
// weight through a ring of bulk copies that runs on across products, with a grid barrier after
// each product; 2 the same without the barriers; 3 and 4 as 1 and 2 with each product's units
// taken column stage first, x kept in registers while the stage stays. ms for all the products (best of several),
// GB/s of weights and that over `copy_gbs`; the largest difference between the stream's sums
// and the backend's over the backend's largest output; `stuck` if a barrier gave up waiting.
// `ran` false where the device has no sm_90 or cooperative launch.
struct StepStreamRates {
  int M = 0, layers = 0, products = 0, blocks = 0;
  bool ran = false, stuck = false;
  double weight_bytes = 0, ms[5] = {}, gbs[5] = {}, of_copy[5] = {};
  double max_rel_diff = 0;
};
StepStreamRates step_stream_probe(int M, int layers, double copy_gbs);

// What one dependency between two steps costs with no work in the way (sync_cost.cu): µs per
// step of `steps` steps over blocks_per_sm × SMs blocks of 256 threads, each step a kernel in
// stream order, a kernel under programmatic dependent launch (as the backend launches; `pdl`
// false when that is off or unsupported), the same released by hand-off counters instead of the
// wait (handoff_us) or launching the next kernel before its own wait (early_us), or a grid
// barrier inside one resident kernel (barrier_us < 0 when the device has no cooperative launch).
struct SyncCosts {
  int blocks = 0, steps = 0;
  bool pdl = false;
  double stream_us = 0, pdl_us = 0, handoff_us = 0, early_us = 0, barrier_us = -1;
};
SyncCosts sync_costs(int steps, int blocks_per_sm);

// What a CUDA graph would save on one step (dflash bench --graph-probe): the work `step`
// queues on the backend, `reps` times launched op by op and `reps` times replayed from one
// graph captured from a call of it; GPU milliseconds a step each way (event-timed, no host wait
// between steps), with the graph's node, edge and programmatic (PDL) edge counts. `step` must
// queue the same work at the same addresses every call and read nothing back.
// Host milliseconds too (wall clock, the stream idle before each): queuing one step op by op,
// capturing it, instantiating the capture, and updating the instantiated graph from a second
// capture (how a graph would follow a step whose arguments change).
struct GraphProbe {
  double launched_ms = 0, replayed_ms = 0;
  double host_enqueue_ms = 0, host_capture_ms = 0, host_instantiate_ms = 0, host_update_ms = 0;
  size_t nodes = 0, edges = 0, programmatic_edges = 0;
};
GraphProbe graph_probe(Backend& backend, const std::function<void()>& step, int reps);

// What Backend::queue_recorded has done on this backend so far: graphs launched, and how many
// of those were updated in place from their capture or instantiated (a first capture, or one
// whose shape the executable could not take).
// first_refusal: why cudaGraphExecUpdate first refused an update ("" if it never did), with
// the node it names.
struct GraphCounts {
  int64_t launched = 0, updated = 0, instantiated = 0;
  std::string first_refusal;
};
GraphCounts graph_counts(Backend& backend);

}  // namespace dflash::cuda
