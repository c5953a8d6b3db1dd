// The CUDA backend: bf16 weights and activations (KV caches included), f32 accumulation
// everywhere, f32 logits. One stream carries every op; the host waits only where it must
// read results (download, argmax_rows). Matrix products of more than kSkinnyMaxRows rows go
// to cuBLAS; decode and verification products go to the batch-invariant skinny kernel.
// DFLASH_CUDA_PROFILE=1 times every op with event pairs (profiler.h); otherwise each op pays
// one null test for it. Five parts have files of their own: the ring of pinned slots small
// uploads go through (staging_ring.h), steps recorded as CUDA graphs (graph_recorder.h), the
// reads of token ids that the host waits on later (id_reads.h), the results it waits on now
// (read_back.h) and the sampling ops (sampling_ops.h).
#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/device_pool.h"
#include "backend/cuda/graph_recorder.h"
#include "backend/cuda/id_reads.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/op_args.h"
#include "backend/cuda/profiler.h"
#include "backend/cuda/read_back.h"
#include "backend/cuda/sampling_ops.h"
#include "backend/cuda/staging_ring.h"
#include "backend/cuda/timeline.h"

namespace dflash {
namespace cuda {
namespace {

Elem elem_of(const Tensor& t, const char* op) {
  if (t.dtype == DType::F32) return Elem::F32;
  if (t.dtype == DType::BF16) return Elem::BF16;
  throw Error(std::string("cuda ") + op + ": unsupported dtype " + t.describe());
}

// kv_len changes every decode step: the profile groups it in powers of two.
std::string kv_bucket(int64_t kv_len) {
  int64_t b = 1;
  while (b < kv_len) b *= 2;
  return "kv<=" + std::to_string(b);
}

// Token ids on the device: I32 [rows, 1], contiguous.
void expect_ids(const Tensor& ids, int64_t rows, const char* op) {
  expect(ids, DType::I32, op, "ids");
  if (ids.rows != rows || ids.cols != 1 || ids.ld != 1)
    throw Error(std::string("cuda ") + op + ": ids must be I32 [" + std::to_string(rows) + ", 1], got " +
                ids.describe());
}

// DFLASH_CUDA_GRAPHS=0 launches recorded steps op by op (measuring).
bool graphs_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("DFLASH_CUDA_GRAPHS");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

void expect_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  if (a.rows != b.rows || a.cols != b.cols)
    throw Error(std::string("cuda ") + op + ": shapes differ: " + a.describe() + " and " + b.describe());
}

// The table of one RopeTable as last uploaded; the parameters are kept to notice a different
// table that happens to reuse the address of a destroyed one.
struct RopeEntry {
  std::shared_ptr<void> cos, sin;
  int64_t size = 0;
  int head_dim = 0;
  float scaling = 0.f;
  std::vector<float> inv_freq;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend() : pool_(std::make_shared<DevicePool>()) {
    check(cudaSetDevice(0), "init", "cudaSetDevice");
    // Blocking with respect to the legacy default stream, so a stray synchronous cudaMemcpy
    // elsewhere still orders correctly with this stream.
    check(cudaStreamCreate(&stream_), "init", "cudaStreamCreate");
    check_blas(cublasCreate(&blas_), "init", "cublasCreate");
    check_blas(cublasSetStream(blas_, stream_), "init", "cublasSetStream");
    // A fixed workspace: cuBLAS would otherwise allocate its own on first use of some kernels.
    workspace_ = pool_->allocate(kWorkspaceBytes, "init");
    check_blas(cublasSetWorkspace(blas_, workspace_.get(), kWorkspaceBytes), "init", "cublasSetWorkspace");
    staging_ = std::make_unique<StagingRing>(stream_);
    graphs_ = std::make_unique<GraphRecorder>(stream_, *staging_);
    id_reads_ = std::make_unique<IdReads>(stream_);
    check(cudaStreamCreateWithFlags(&upload_stream_, cudaStreamNonBlocking), "init", "cudaStreamCreate");
    prof_ = OpProfiler::from_env(stream_);
    timeline_ = Timeline::from_env();
    read_back_ = std::make_unique<ReadBack>(stream_);
    sampling_ = std::make_unique<SamplingOps>(*pool_, stream_, *read_back_, prof_.get());
    auto knob_is = [](const char* knob, const char* value) {
      const char* e = std::getenv(knob);
      return e && std::strcmp(e, value) == 0;
    };
    tile_weights_ = knob_is("DFLASH_CUDA_TILED_WEIGHTS", "1");
    features_in_epilogue_ = !knob_is("DFLASH_FEATURES_FROM_EPILOGUE", "0");
    fuse_argmax_ = !knob_is("DFLASH_FUSED_ARGMAX", "0");
    fuse_embed_norm_ = !knob_is("DFLASH_FUSED_EMBED_NORM", "0");
  }

  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    sampling_.reset();
    prof_.reset();  // prints the profile, if one was asked for
    timeline_.reset();  // writes the timeline, if one was asked for
    graphs_.reset();
    staging_.reset();
    id_reads_.reset();
    cudaStreamDestroy(upload_stream_);
    read_back_.reset();
    rope_.clear();
    workspace_.reset();
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }
  DeviceKind device() const override { return DeviceKind::CUDA; }
  DType activation_dtype() const override { return DType::BF16; }

  Tensor alloc(int64_t rows, int64_t cols, DType dtype) override {
    Tensor t;
    t.storage = pool_->allocate(size_t(rows * cols) * dtype_size(dtype), "alloc");
    t.data = t.storage.get();
    t.dtype = dtype;
    t.device = DeviceKind::CUDA;
    t.rows = rows;
    t.cols = cols;
    t.ld = cols;
    return t;
  }

  // Device memory that lives as long as the model (weights): straight from the driver, not
  // through the pool.
  static std::shared_ptr<void> weight_memory(size_t bytes, const std::string& what) {
    void* p = nullptr;
    check(cudaMalloc(&p, std::max<size_t>(bytes, 1)), "upload_weight",
          ("allocating " + std::to_string(bytes) + " bytes for " + what).c_str());
    return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  }

  // 2-D weights (projections, embeddings) become bf16 whatever the checkpoint stores; 1-D
  // ones (norm scales) become f32: they are tiny, and f32 keeps them exact for every source
  // dtype.
  Tensor upload_weight(const std::vector<const TensorInfo*>& parts) override {
    for (const auto* p : parts)
      if (p->dtype != DType::BF16 && p->dtype != DType::F16 && p->dtype != DType::F32)
        throw Error("cuda upload_weight: tensor '" + p->name + "' has dtype " + dtype_name(p->dtype));
    const FusedWeightShape shape = fused_weight_shape(parts);
    const int64_t rows = shape.rows, cols = shape.cols;
    const bool matrix = shape.all_matrices;
    const DType dt = matrix ? DType::BF16 : DType::F32;
    Tensor t;
    const size_t bytes = size_t(rows * cols) * dtype_size(dt);
    t.storage = weight_memory(bytes, "'" + parts.front()->name + "'");
    void* p = t.storage.get();
    t.data = p;
    t.dtype = dt;
    t.device = DeviceKind::CUDA;
    t.rows = rows;
    t.cols = cols;
    t.ld = cols;
    char* dst = static_cast<char*>(p);
    std::vector<uint16_t> half;
    std::vector<float> wide;
    for (const auto* part : parts) {
      const size_t n = size_t(part->numel());
      const void* src = part->data;
      if (dt == DType::BF16 && part->dtype != DType::BF16) {
        wide.resize(n);
        convert_to_f32(part->dtype, part->data, wide.data(), n);
        half.resize(n);
        for (size_t i = 0; i < n; ++i) half[i] = f32_to_bf16(wide[i]);
        src = half.data();
      } else if (dt == DType::F32 && part->dtype != DType::F32) {
        wide.resize(n);
        convert_to_f32(part->dtype, part->data, wide.data(), n);
        src = wide.data();
      }
      const size_t nb = n * dtype_size(dt);
      // Synchronous: the staging vectors are reused for the next part.
      check(cudaMemcpy(dst, src, nb, cudaMemcpyHostToDevice), "upload_weight",
            ("copying '" + part->name + "' to the device").c_str());
      dst += nb;
    }
    t.weight = true;
    if (tile_weights_ && matrix && skinny_tiles(rows, cols, cols)) {
      std::shared_ptr<void> copy =
          weight_memory(skinny_tiled_bytes(rows, cols), "the tiled copy of '" + parts.front()->name + "'");
      // A copy from pageable memory may still be in flight when cudaMemcpy returns.
      check(cudaDeviceSynchronize(), "upload_weight", "waiting for the weight's copy");
      skinny_tile_weight(p, rows, cols, cols, copy.get(), upload_stream_);
      check(cudaStreamSynchronize(upload_stream_), "upload_weight", "tiling a weight");
      tiled_[p] = TiledCopy{std::move(copy), rows, cols};
    }
    return t;
  }

  // The pre-tiled copy of weight w (DFLASH_CUDA_TILED_WEIGHTS=1), where w is a whole uploaded
  // weight: null for any other tensor, views of a weight included.
  const void* tiled_for(const Tensor& w) const {
    if (!w.weight || tiled_.empty()) return nullptr;
    const auto it = tiled_.find(w.data);
    return it != tiled_.end() && it->second.rows == w.rows && it->second.cols == w.cols && w.ld == w.cols
               ? it->second.data.get()
               : nullptr;
  }
  bool features_in_epilogue() const { return features_in_epilogue_; }
  // Where matmul_normed_argmax chooses inside the product's kernel (skinny_matmul_argmax).
  bool argmax_fusable(const Tensor& h, const Tensor& w) const {
    return fuse_argmax_ && h.dtype == DType::BF16 && w.dtype == DType::BF16 && w.cols == h.cols &&
           h.rows <= kSkinnyMaxRows &&
           skinny_argmax_applies(h.data, h.ld, w.data, w.ld, int(h.rows), int(w.rows), int(h.cols));
  }

  Tensor upload(const float* host, int64_t rows, int64_t cols) override {
    Tensor t = alloc(rows, cols, DType::F32);
    OpTimer timer(prof_.get(), "upload", [&] { return dims(rows, cols); });
    check(cudaMemcpyAsync(t.data, host, size_t(rows * cols) * sizeof(float), cudaMemcpyHostToDevice, stream_),
          "upload", "host to device copy");
    return t;
  }

  void download(const Tensor& t, float* host) override {
    expect_device(t, "download", "source");
    if (t.numel() == 0) return;
    OpTimer timer(prof_.get(), "download", [&] { return dims(t); });
    Tensor src = t;
    if (t.dtype != DType::F32) {  // widen on the device, then one packed copy
      src = alloc(t.rows, t.cols, DType::F32);
      copy_convert(t.data, t.ld, elem_of(t, "download"), src.data, src.ld, Elem::F32, t.rows, t.cols, stream_);
    }
    check(cudaMemcpy2DAsync(host, size_t(t.cols) * sizeof(float), src.data, size_t(src.ld) * sizeof(float),
                            size_t(t.cols) * sizeof(float), size_t(t.rows), cudaMemcpyDeviceToHost, stream_),
          "download", "device to host copy");
    timer.stop();
    check(cudaStreamSynchronize(stream_), "download", "synchronising the stream");
  }

  void matmul(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) override {
    expect(x, DType::BF16, "matmul", "x");
    expect(w, DType::BF16, "matmul", "w");
    expect_device(y, "matmul", "y");
    const Elem ye = elem_of(y, "matmul");
    if (x.cols != w.cols || y.rows != x.rows || y.cols != w.rows)
      throw Error("cuda matmul: shapes " + x.describe() + " · " + w.describe() + "ᵀ → " + y.describe());
    const int64_t M = x.rows, N = w.rows, K = x.cols;
    if (M == 0 || N == 0) return;
    OpTimer timer(prof_.get(), M <= kSkinnyMaxRows ? "matmul M<=32" : "matmul cublas", [&] {
      return std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N) + (ye == Elem::F32 ? " f32" : "") +
             (accumulate ? " +=" : "");
    });
    if (M <= kSkinnyMaxRows) {
      skinny_matmul(x.data, x.ld, w.data, w.ld, y.data, y.ld, ye, int(M), int(N), int(K), accumulate, w.weight,
                    stream_, nullptr, tiled_for(w));
      return;
    }
    // Row-major y[M,N] = x[M,K]·w[N,K]ᵀ is column-major yᵀ[N,M] = w·xᵀ with w read transposed.
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    check_blas(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &alpha, w.data, CUDA_R_16BF,
                            int(w.ld), x.data, CUDA_R_16BF, int(x.ld), &beta, y.data,
                            ye == Elem::F32 ? CUDA_R_32F : CUDA_R_16BF, int(y.ld), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               "matmul", ("cublasGemmEx " + x.describe() + " · " + w.describe() + "ᵀ").c_str());
  }

  // Decode and verification rows: one launch computes the gate and up products of the same
  // columns in one warp and stores silu(gate)·up (skinny_matmul.cu), the same bits as matmul +
  // silu_mul, without the second launch and the gate_up round trip. Always on where it applies;
  // prefill and other shapes take the default composition.
  void matmul_silu_mul(const Tensor& x, const Tensor& w, Tensor& act) override {
    const int64_t M = x.rows, N = w.rows, K = x.cols;
    const bool paired = M <= kSkinnyMaxRows && x.device == DeviceKind::CUDA && x.dtype == DType::BF16 &&
                        w.device == DeviceKind::CUDA && w.dtype == DType::BF16 && w.cols == K &&
                        act.device == DeviceKind::CUDA && act.dtype == DType::BF16 && act.rows == M &&
                        2 * act.cols == N && K <= INT32_MAX && N <= INT32_MAX &&
                        skinny_silu_pair_supported(x.data, x.ld, w.data, w.ld, int(N), int(K));
    if (!paired) return Backend::matmul_silu_mul(x, w, act);
    if (M == 0 || N == 0) return;
    OpTimer timer(prof_.get(), "matmul_silu_mul M<=32",
                  [&] { return std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N); });
    skinny_matmul_silu_mul(x.data, x.ld, w.data, w.ld, act.data, act.ld, int(M), int(N), int(K), w.weight, stream_,
                           nullptr, tiled_for(w));
  }

  // The RMSNorm between two products, deferred for decode and verification rows (M ≤ 32):
  // the product before it (or norm_emit, for a pass's first norm) stores bf16(norm_w ⊙ x) and
  // per-row partial sums of x², and the product after it scales its sums by each row's 1/rms
  // (kernels.h, SkinnyNorm), so the norm costs no launch of its own. Rounding happens before
  // the 1/rms instead of after it, the same relative error. Every condition reads shapes,
  // dtypes, pointers and strides, never M beyond the prefill cut, so a row alone and in its
  // block take the same path. DFLASH_DEFERRED_NORM=0 keeps rms_norm + product (to measure).
  static bool deferred_norm_enabled() {
    static const bool on = [] {
      const char* e = std::getenv("DFLASH_DEFERRED_NORM");
      return !(e && std::string(e) == "0");
    }();
    return on;
  }
  static bool on_device(const Tensor& t, DType dt) { return t.device == DeviceKind::CUDA && t.dtype == dt; }
  static bool aligned16(const Tensor& t) { return rows_aligned16(t.data, t.ld, int(dtype_size(t.dtype))); }
  bool deferrable(const Tensor& x, const Tensor& norm_w, const Tensor& h) const {
    return deferred_norm_enabled() && x.rows <= kSkinnyMaxRows && on_device(x, DType::F32) &&
           on_device(norm_w, DType::F32) && norm_w.numel() == x.cols && on_device(h, DType::BF16) &&
           h.rows == x.rows && h.cols == x.cols && x.cols % 4 == 0 && x.cols <= 16384 && aligned16(x) &&
           aligned16(h) && reinterpret_cast<uintptr_t>(norm_w.data) % 16 == 0;
  }
  static void remember(NormedRows& out, const Tensor& x, const Tensor& norm_w, float eps) {
    out.x = x;
    out.norm_w = norm_w;
    out.eps = eps;
  }

  void norm_rows(const Tensor& x, const Tensor& norm_w, float eps, NormedRows& out) override {
    if (!deferrable(x, norm_w, out.h)) return Backend::norm_rows(x, norm_w, eps, out);
    out.partial = alloc(x.rows, 1, DType::F32);
    remember(out, x, norm_w, eps);
    out.deferred = true;
    OpTimer timer(prof_.get(), "norm_rows (deferred)", [&] { return dims(x); });
    norm_emit(x.ptr<float>(), x.ld, norm_w.ptr<float>(), out.h.ptr<__nv_bfloat16>(), out.h.ld,
              out.partial.ptr<float>(), x.rows, x.cols, stream_);
  }

  void matmul_add_norm(const Tensor& a, const Tensor& w, Tensor& x, const Tensor& norm_w, float eps,
                       NormedRows& out, Tensor* x_copy) override {
    const int64_t M = a.rows, N = w.rows, K = a.cols;
    const bool fused = deferrable(x, norm_w, out.h) && on_device(a, DType::BF16) && on_device(w, DType::BF16) &&
                       w.cols == K && x.rows == M && x.cols == N && N <= INT32_MAX && K <= INT32_MAX &&
                       skinny_mma_applies(a.data, a.ld, w.data, w.ld, int(K));
    if (!fused || M == 0) return Backend::matmul_add_norm(a, w, x, norm_w, eps, out, x_copy);
    // The copy from the epilogue where it is a plain bf16 one; otherwise as its own op below.
    const bool copy_in_epilogue = features_in_epilogue_ && x_copy && on_device(*x_copy, DType::BF16) &&
                                  x_copy->rows == M && x_copy->cols == N;
    const int parts = skinny_norm_parts(int(N), int(K));
    out.partial = alloc(M, parts, DType::F32);
    remember(out, x, norm_w, eps);
    out.deferred = true;
    SkinnyNorm emit;
    emit.norm_w = norm_w.ptr<float>();
    emit.h = out.h.ptr<__nv_bfloat16>();
    emit.ldh = out.h.ld;
    emit.partial_out = out.partial.ptr<float>();
    emit.ld_partial = out.partial.ld;
    if (copy_in_epilogue) {
      emit.y_copy = x_copy->ptr<__nv_bfloat16>();
      emit.ld_y_copy = x_copy->ld;
    }
    {
      OpTimer timer(prof_.get(), "matmul_add_norm M<=32",
                    [&] { return std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N); });
      skinny_matmul(a.data, a.ld, w.data, w.ld, x.data, x.ld, Elem::F32, int(M), int(N), int(K), true, w.weight,
                    stream_, &emit, tiled_for(w));
    }
    if (x_copy && !copy_in_epilogue) copy(x, *x_copy);
  }

  // The consuming side: the product's sums times each row's 1/rms (SkinnyNorm).
  SkinnyNorm consume(const NormedRows& in) const {
    SkinnyNorm n;
    n.partial_in = in.partial.ptr<float>();
    n.ld_partial = in.partial.ld;
    n.parts = static_cast<int>(in.partial.cols);
    n.eps = in.eps;
    return n;
  }
  bool consumable(const NormedRows& in, const Tensor& w) const {
    return in.deferred && on_device(w, DType::BF16) && w.cols == in.h.cols && w.rows <= INT32_MAX &&
           skinny_mma_applies(in.h.data, in.h.ld, w.data, w.ld, int(in.h.cols));
  }

  void matmul_normed(const NormedRows& in, const Tensor& w, Tensor& y) override {
    if (!in.deferred) return matmul(in.h, w, y, false);
    if (!consumable(in, w) || !(on_device(y, DType::F32) || on_device(y, DType::BF16)) || y.rows != in.h.rows ||
        y.cols != w.rows)
      return Backend::matmul_normed(in, w, y);
    const int64_t M = in.h.rows, N = w.rows, K = in.h.cols;
    if (M == 0 || N == 0) return;
    const SkinnyNorm n = consume(in);
    OpTimer timer(prof_.get(), "matmul_normed M<=32",
                  [&] { return std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N); });
    skinny_matmul(in.h.data, in.h.ld, w.data, w.ld, y.data, y.ld, elem_of(y, "matmul_normed"), int(M), int(N),
                  int(K), false, w.weight, stream_, &n, tiled_for(w));
  }

  void matmul_normed_argmax(const NormedRows& in, const Tensor& w, Tensor& ids) override {
    expect_ids(ids, in.h.rows, "matmul_normed_argmax");
    const int64_t M = in.h.rows, N = w.rows, K = in.h.cols;
    if (!consumable(in, w) || !argmax_fusable(in.h, w)) return Backend::matmul_normed_argmax(in, w, ids);
    const SkinnyNorm n = consume(in);
    auto scratch = pool_->allocate(skinny_argmax_scratch_bytes(int(M)), "matmul_normed_argmax");
    OpTimer timer(prof_.get(), "matmul_normed_argmax M<=16",
                  [&] { return std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N); });
    skinny_matmul_argmax(in.h.data, in.h.ld, w.data, w.ld, nullptr, 0, int(M), int(N), int(K), w.weight, n,
                         ids.ptr<int32_t>(), ids.ld, scratch.get(), stream_);
  }

  void matmul_silu_mul_normed(const NormedRows& in, const Tensor& w, Tensor& act) override {
    if (!in.deferred) return matmul_silu_mul(in.h, w, act);
    const int64_t M = in.h.rows, N = w.rows, K = in.h.cols;
    if (!consumable(in, w) || !on_device(act, DType::BF16) || act.rows != M || 2 * act.cols != N ||
        !skinny_silu_pair_supported(in.h.data, in.h.ld, w.data, w.ld, int(N), int(K)))
      return Backend::matmul_silu_mul_normed(in, w, act);
    if (M == 0 || N == 0) return;
    const SkinnyNorm n = consume(in);
    OpTimer timer(prof_.get(), "matmul_silu_mul_normed M<=32",
                  [&] { return std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(N); });
    skinny_matmul_silu_mul(in.h.data, in.h.ld, w.data, w.ld, act.data, act.ld, int(M), int(N), int(K), w.weight,
                           stream_, &n, tiled_for(w));
  }

  void rms_norm(const Tensor& x, const Tensor& w, float eps, int64_t group, Tensor& y) override {
    expect_device(x, "rms_norm", "x");
    expect_device(w, "rms_norm", "w");
    expect_device(y, "rms_norm", "y");
    if (group <= 0 || x.cols % group || w.numel() != group)
      throw Error("cuda rms_norm: " + x.describe() + " with groups of " + std::to_string(group) + ", weight " +
                  w.describe());
    expect_same_shape(x, y, "rms_norm");
    OpTimer timer(prof_.get(), "rms_norm", [&] { return dims(x) + " /" + std::to_string(group); });
    cuda::rms_norm(x.data, x.ld, elem_of(x, "rms_norm"), w.data, elem_of(w, "rms_norm"), y.data, y.ld,
                   elem_of(y, "rms_norm"), x.rows, x.cols, group, eps, stream_);
  }

  // Checks that every position lies in the table. Positions are nearly always a run (a prompt, a
  // block): then they travel to the kernel as one number (positions[0]) and this returns null;
  // otherwise they are uploaded.
  std::shared_ptr<void> device_positions(const std::vector<int32_t>& positions, const RopeTable& table,
                                         const char* op) {
    bool consecutive = true;
    for (size_t r = 0; r < positions.size(); ++r) {
      if (positions[r] < 0 || positions[r] >= table.size())
        throw Error(std::string("cuda ") + op + ": position " + std::to_string(positions[r]) + " outside the table");
      consecutive = consecutive && positions[r] == positions[0] + int32_t(r);
    }
    return consecutive ? nullptr : upload_ints(positions, op);
  }

  void rope(Tensor& x, const std::vector<int32_t>& positions, int64_t head_dim, const RopeTable& table) override {
    expect(x, DType::BF16, "rope", "x");
    if (static_cast<int64_t>(positions.size()) != x.rows)
      throw Error("cuda rope: " + std::to_string(positions.size()) + " positions for " + x.describe());
    if (head_dim % 2 || x.cols % head_dim || table.head_dim() != head_dim)
      throw Error("cuda rope: head_dim " + std::to_string(head_dim) + " for " + x.describe() + " and a table of " +
                  std::to_string(table.head_dim()));
    const std::shared_ptr<void> dev_pos = device_positions(positions, table, "rope");
    if (x.rows == 0) return;
    OpTimer timer(prof_.get(), "rope", [&] {
      return std::to_string(x.rows) + "x" + std::to_string(x.cols / head_dim) + "x" + std::to_string(head_dim);
    });
    const RopeEntry& e = rope_table(table);
    cuda::rope(x.data, x.ld, x.rows, x.cols / head_dim, head_dim, static_cast<const int32_t*>(dev_pos.get()),
               positions[0], static_cast<const float*>(e.cos.get()), static_cast<const float*>(e.sin.get()), stream_);
  }

  void qk_norm_rope_store(Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_norm, const Tensor& k_norm,
                          float eps, const std::vector<int32_t>& positions, int64_t head_dim, const RopeTable& table,
                          Tensor& k_dst, Tensor& v_dst) override {
    const char* op = "qk_norm_rope_store";
    if (!q.empty()) expect(q, DType::BF16, op, "q");
    expect(k, DType::BF16, op, "k");
    expect(v, DType::BF16, op, "v");
    expect(k_dst, DType::BF16, op, "k_dst");
    expect(v_dst, DType::BF16, op, "v_dst");
    expect(q_norm, DType::F32, op, "q_norm");
    expect(k_norm, DType::F32, op, "k_norm");
    const int64_t T = k.rows;
    if (head_dim % 2 || k.cols % head_dim || k_norm.numel() != head_dim || q_norm.numel() != head_dim ||
        table.head_dim() != head_dim || (!q.empty() && (q.rows != T || q.cols % head_dim)))
      throw Error(std::string("cuda ") + op + ": q " + q.describe() + ", k " + k.describe() + ", head_dim " +
                  std::to_string(head_dim));
    expect_same_shape(k, v, op);
    expect_same_shape(k, k_dst, op);
    expect_same_shape(v, v_dst, op);
    if (static_cast<int64_t>(positions.size()) != T)
      throw Error(std::string("cuda ") + op + ": " + std::to_string(positions.size()) + " positions for " +
                  std::to_string(T) + " rows");
    const std::shared_ptr<void> dev_pos = device_positions(positions, table, op);
    if (T == 0) return;
    const int64_t hq = q.empty() ? 0 : q.cols / head_dim, hkv = k.cols / head_dim;
    OpTimer timer(prof_.get(), op, [&] {
      return std::to_string(T) + "x(" + std::to_string(hq) + "+2x" + std::to_string(hkv) + ")x" +
             std::to_string(head_dim);
    });
    const RopeEntry& e = rope_table(table);
    cuda::qk_norm_rope_store(q.data, q.ld, hq, k.data, k.ld, v.data, v.ld, hkv, q_norm.ptr<float>(),
                             k_norm.ptr<float>(), eps, T, head_dim, static_cast<const int32_t*>(dev_pos.get()),
                             positions[0], static_cast<const float*>(e.cos.get()),
                             static_cast<const float*>(e.sin.get()), k_dst.data, k_dst.ld, v_dst.data, v_dst.ld,
                             stream_);
  }

  void kv_norm_rope_store(const std::vector<KvRows>& layers, float eps, const std::vector<int32_t>& positions,
                          int64_t head_dim, const RopeTable& table) override {
    const char* op = "kv_norm_rope_store";
    // DFLASH_KV_STORE_LAYERS=0 (measuring only): a launch a layer, as before 2026-12-03.
    static const bool enabled = [] {
      const char* e = std::getenv("DFLASH_KV_STORE_LAYERS");
      return !(e && std::string(e) == "0");
    }();
    const int64_t T = layers.empty() ? 0 : layers[0].k.rows;
    bool fused = enabled && cuda::kv_norm_rope_store_applies(int64_t(layers.size()), head_dim) &&
                 table.head_dim() == head_dim && static_cast<int64_t>(positions.size()) == T &&
                 layers[0].k.cols % head_dim == 0;
    for (const KvRows& l : layers) {
      fused = fused && on_device(l.k, DType::BF16) && on_device(l.v, DType::BF16) && on_device(l.k_dst, DType::BF16) &&
              on_device(l.v_dst, DType::BF16) && on_device(l.k_norm, DType::F32) && l.k_norm.numel() == head_dim &&
              l.k.rows == T && l.k.cols == layers[0].k.cols;
      if (!fused) break;
      expect_same_shape(l.k, l.v, op);
      expect_same_shape(l.k, l.k_dst, op);
      expect_same_shape(l.v, l.v_dst, op);
    }
    if (!fused) return Backend::kv_norm_rope_store(layers, eps, positions, head_dim, table);
    const std::shared_ptr<void> dev_pos = device_positions(positions, table, op);
    if (T == 0) return;
    OpTimer timer(prof_.get(), op, [&] {
      return std::to_string(layers.size()) + "x" + std::to_string(T) + "x2x" +
             std::to_string(layers[0].k.cols / head_dim) + "x" + std::to_string(head_dim);
    });
    std::vector<cuda::KvLayerRows> rows;
    for (const KvRows& l : layers)
      rows.push_back({l.k.data, l.v.data, l.k_norm.ptr<float>(), l.k_dst.data, l.v_dst.data, l.k.ld, l.v.ld,
                      l.k_dst.ld, l.v_dst.ld});
    const RopeEntry& e = rope_table(table);
    cuda::kv_norm_rope_store(rows.data(), int64_t(rows.size()), layers[0].k.cols / head_dim, eps, T, head_dim,
                             static_cast<const int32_t*>(dev_pos.get()), positions[0],
                             static_cast<const float*>(e.cos.get()), static_cast<const float*>(e.sin.get()), stream_);
  }

  void attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t kv_len, int64_t q_pos0, int64_t head_dim,
                 AttentionMask mask, Tensor& out) override {
    expect(q, DType::BF16, "attention", "q");
    expect(k, DType::BF16, "attention", "k");
    expect(v, DType::BF16, "attention", "v");
    expect(out, DType::BF16, "attention", "out");
    if (head_dim <= 0 || q.cols % head_dim || k.cols % head_dim || k.cols != v.cols || out.rows != q.rows ||
        out.cols != q.cols)
      throw Error("cuda attention: q " + q.describe() + ", k " + k.describe() + ", v " + v.describe() + ", out " +
                  out.describe() + ", head_dim " + std::to_string(head_dim));
    const int64_t hq = q.cols / head_dim, hkv = k.cols / head_dim;
    if (hkv == 0 || hq % hkv) throw Error("cuda attention: " + std::to_string(hq) + " query heads over " +
                                          std::to_string(hkv) + " key/value heads");
    if (kv_len < 0 || kv_len > k.rows || kv_len > v.rows)
      throw Error("cuda attention: kv_len " + std::to_string(kv_len) + " beyond the cache (" + k.describe() + ")");
    OpTimer timer(prof_.get(), "attention", [&] {
      // std::string first: GCC 12 warns falsely (-Wrestrict) on a literal + a temporary string
      return std::string("T") + std::to_string(q.rows) + " " + kv_bucket(kv_len) + " " + std::to_string(hq) + "/" +
             std::to_string(hkv) + "x" + std::to_string(head_dim) + (mask == AttentionMask::Causal ? " causal" : "");
    });
    // The split path's f32 partials come from the pool: freed when this returns, reused only by
    // work queued behind the kernels that read them (one stream). The request grows with kv_len
    // every 64 keys; rounded up to a power of two it maps to a few cached blocks instead of a
    // synchronising cudaMalloc every 64 decode steps.
    std::shared_ptr<void> scratch;
    if (const size_t bytes = attention_scratch_bytes(q.rows, hq, head_dim, kv_len)) {
      size_t rounded = 4096;
      while (rounded < bytes) rounded *= 2;
      scratch = pool_->allocate(rounded, "attention");
    }
    cuda::attention(q.data, q.ld, k.data, k.ld, v.data, v.ld, out.data, out.ld, q.rows, hq, hkv, head_dim, kv_len,
                    q_pos0, mask == AttentionMask::Causal, scratch.get(), stream_);
  }

  void silu_mul(const Tensor& gate_up, Tensor& out) override {
    expect_device(gate_up, "silu_mul", "gate_up");
    expect_device(out, "silu_mul", "out");
    if (gate_up.rows != out.rows || gate_up.cols != 2 * out.cols)
      throw Error("cuda silu_mul: " + gate_up.describe() + " → " + out.describe());
    OpTimer timer(prof_.get(), "silu_mul", [&] { return dims(out); });
    cuda::silu_mul(gate_up.data, gate_up.ld, elem_of(gate_up, "silu_mul"), out.data, out.ld, elem_of(out, "silu_mul"),
                   out.rows, out.cols, stream_);
  }

  // embed()'s checks: the shapes, and every id a row of the table.
  static void check_embed(const std::vector<int32_t>& ids, const Tensor& table, const Tensor& out) {
    expect_device(table, "embed", "table");
    expect_device(out, "embed", "out");
    if (out.rows != static_cast<int64_t>(ids.size()) || out.cols != table.cols)
      throw Error("cuda embed: " + std::to_string(ids.size()) + " ids from " + table.describe() + " into " +
                  out.describe());
    for (int32_t id : ids)
      if (id < 0 || id >= table.rows)
        throw Error("token id " + std::to_string(id) + " is outside the embedding table (" +
                    std::to_string(table.rows) + " rows)");
  }

  void embed(const std::vector<int32_t>& ids, const Tensor& table, Tensor& out) override {
    check_embed(ids, table, out);
    if (ids.empty()) return;
    OpTimer timer(prof_.get(), "embed", [&] { return std::to_string(ids.size()) + "x" + std::to_string(table.cols); });
    auto dev_ids = upload_ints(ids, "embed");
    cuda::embed(static_cast<const int32_t*>(dev_ids.get()), static_cast<int64_t>(ids.size()), table.data, table.ld,
                elem_of(table, "embed"), table.cols, out.data, out.ld, elem_of(out, "embed"), stream_);
  }

  void copy(const Tensor& src, Tensor& dst) override {
    expect_device(src, "copy", "src");
    expect_device(dst, "copy", "dst");
    expect_same_shape(src, dst, "copy");
    if (src.numel() == 0) return;
    OpTimer timer(prof_.get(), "copy", [&] { return dims(src) + "->" + dtype_name(dst.dtype); });
    if (src.dtype == dst.dtype) {
      const size_t es = dtype_size(src.dtype);
      check(cudaMemcpy2DAsync(dst.data, size_t(dst.ld) * es, src.data, size_t(src.ld) * es, size_t(src.cols) * es,
                              size_t(src.rows), cudaMemcpyDeviceToDevice, stream_),
            "copy", ("device to device copy " + src.describe() + " → " + dst.describe()).c_str());
      return;
    }
    copy_convert(src.data, src.ld, elem_of(src, "copy"), dst.data, dst.ld, elem_of(dst, "copy"), src.rows, src.cols,
                 stream_);
  }

  void add(const Tensor& x, Tensor& y) override {
    expect_device(x, "add", "x");
    expect_device(y, "add", "y");
    expect_same_shape(x, y, "add");
    OpTimer timer(prof_.get(), "add", [&] { return dims(x) + "+" + dtype_name(y.dtype); });
    cuda::add(x.data, x.ld, elem_of(x, "add"), y.data, y.ld, elem_of(y, "add"), x.rows, x.cols, stream_);
  }

  std::vector<CandidateRow> top_k_rows(const Tensor& logits, int k, float inv_t, int max_count) override {
    expect(logits, DType::F32, "top_k_rows", "logits");
    k = static_cast<int>(std::min<int64_t>(k, logits.cols));
    if (logits.rows == 0 || k <= 0 || max_count <= 0) return Backend::top_k_rows(logits, k, inv_t, max_count);
    return sampling_->top_k_rows(logits, k, inv_t, max_count);
  }
  std::vector<CandidateRow> top_p_rows(const Tensor& logits, float inv_t, float top_p, int max_count) override {
    expect(logits, DType::F32, "top_p_rows", "logits");
    if (logits.rows == 0 || max_count <= 0) return Backend::top_p_rows(logits, inv_t, top_p, max_count);
    return sampling_->top_p_rows(logits, inv_t, top_p, max_count);
  }
  RowLaws row_laws(const Tensor& logits, float inv_t, const std::vector<int32_t>& ids) override {
    return sampling_->row_laws(logits, inv_t, ids);
  }
  std::vector<float> scaled_at(const Tensor& logits, float inv_t,
                               const std::vector<std::pair<int64_t, int32_t>>& at) override {
    return sampling_->scaled_at(logits, inv_t, at);
  }
  std::vector<RowDraw> draw_from_rows(const Tensor& logits, float inv_t, const std::vector<double>& u,
                                      const std::vector<RowLaw>& laws) override {
    return sampling_->draw_from_rows(logits, inv_t, u, laws);
  }
  std::vector<RowLaw> top_p_laws(const Tensor& logits, float inv_t, float top_p, float min_p) override {
    return sampling_->top_p_laws(logits, inv_t, top_p, min_p);
  }
  int32_t draw_from_excess(const Tensor& p_logits, int64_t rp, const RowLaw& lp, const Tensor& q_logits, int64_t rq,
                           const RowLaw& lq, float inv_t, double u) override {
    return sampling_->draw_from_excess(p_logits, rp, lp, q_logits, rq, lq, inv_t, u);
  }

  void apply_penalties(Tensor& logits, const PenaltyTokens& t) override { sampling_->apply_penalties(logits, t); }

  std::vector<int32_t> argmax_rows(const Tensor& x) override {
    expect(x, DType::F32, "argmax_rows", "x");
    std::vector<int32_t> out(size_t(x.rows));
    if (x.rows == 0) return out;
    auto dev = pool_->allocate(out.size() * sizeof(int32_t), "argmax_rows");
    auto part = pool_->allocate(cuda::argmax_scratch_bytes(x.rows, x.cols), "argmax_rows");
    OpTimer timer(prof_.get(), "argmax", [&] { return dims(x.rows, x.cols); });
    cuda::argmax_rows(x.ptr<float>(), x.ld, x.rows, x.cols, static_cast<int32_t*>(dev.get()), part.get(), stream_);
    read_back_->copy(out.data(), dev.get(), out.size() * sizeof(int32_t), "argmax_rows", &timer);
    return out;
  }

  void argmax_rows_into(const Tensor& x, Tensor& ids) override {
    expect(x, DType::F32, "argmax_rows_into", "x");
    expect_ids(ids, x.rows, "argmax_rows_into");
    if (x.rows == 0) return;
    auto part = pool_->allocate(cuda::argmax_scratch_bytes(x.rows, x.cols), "argmax_rows_into");
    OpTimer timer(prof_.get(), "argmax", [&] { return dims(x.rows, x.cols); });
    cuda::argmax_rows(x.ptr<float>(), x.ld, x.rows, x.cols, ids.ptr<int32_t>(), part.get(), stream_);
  }

  // The embedding and the first deferred norm of a pass as one launch (embed_norm_emit): where
  // the norm would be deferred (rows of a decode or verification step) and the rows align.
  bool embed_fusable(const Tensor& table, const Tensor& x, const Tensor& norm_w, const NormedRows& out) const {
    return fuse_embed_norm_ && deferrable(x, norm_w, out.h) && (on_device(table, DType::BF16) || on_device(table, DType::F32)) &&
           table.cols == x.cols &&
           embed_norm_emit_applies(table.data, table.ld, elem_of(table, "embed"), x.ptr<float>(), x.ld,
                                   norm_w.ptr<float>(), out.h.ptr<__nv_bfloat16>(), out.h.ld, x.cols);
  }
  void embed_norm_fused(const int32_t* dev_ids, const Tensor& table, Tensor& x, const Tensor& norm_w, float eps,
                        NormedRows& out) {
    out.partial = alloc(x.rows, 1, DType::F32);
    remember(out, x, norm_w, eps);
    out.deferred = true;
    OpTimer timer(prof_.get(), "embed_normed", [&] { return dims(x); });
    embed_norm_emit(dev_ids, table.data, table.ld, elem_of(table, "embed"), x.ptr<float>(), x.ld, norm_w.ptr<float>(),
                    out.h.ptr<__nv_bfloat16>(), out.h.ld, out.partial.ptr<float>(), x.rows, x.cols, stream_);
  }

  void embed_normed(const std::vector<int32_t>& ids, const Tensor& table, Tensor& x, const Tensor& norm_w, float eps,
                    NormedRows& out) override {
    if (ids.empty() || !embed_fusable(table, x, norm_w, out)) return Backend::embed_normed(ids, table, x, norm_w, eps, out);
    check_embed(ids, table, x);
    auto dev_ids = upload_ints(ids, "embed");
    embed_norm_fused(static_cast<const int32_t*>(dev_ids.get()), table, x, norm_w, eps, out);
  }

  void embed_rows_normed(const Tensor& ids, const Tensor& table, Tensor& x, const Tensor& norm_w, float eps,
                         NormedRows& out) override {
    if (x.rows == 0 || !embed_fusable(table, x, norm_w, out))
      return Backend::embed_rows_normed(ids, table, x, norm_w, eps, out);
    expect_ids(ids, x.rows, "embed_rows");
    embed_norm_fused(ids.ptr<int32_t>(), table, x, norm_w, eps, out);
  }

  void embed_rows(const Tensor& ids, const Tensor& table, Tensor& out) override {
    expect_device(table, "embed_rows", "table");
    expect_device(out, "embed_rows", "out");
    expect_ids(ids, out.rows, "embed_rows");
    if (out.cols != table.cols)
      throw Error("cuda embed_rows: rows of " + table.describe() + " into " + out.describe());
    if (ids.rows == 0) return;
    OpTimer timer(prof_.get(), "embed", [&] { return dims(ids.rows, table.cols); });
    cuda::embed(ids.ptr<int32_t>(), ids.rows, table.data, table.ld, elem_of(table, "embed_rows"), table.cols,
                out.data, out.ld, elem_of(out, "embed_rows"), stream_);
  }

  std::unique_ptr<PendingIds> read_ids(const Tensor& ids) override {
    expect_ids(ids, ids.rows, "read_ids");
    return id_reads_->read(static_cast<const int32_t*>(ids.data), size_t(ids.rows));
  }

  void write_ids(const std::vector<int32_t>& v, Tensor& ids) override {
    expect_ids(ids, static_cast<int64_t>(v.size()), "write_ids");
    if (!v.empty()) staging_->copy(v, ids.data, "write_ids");
  }

  // A timing event, recorded on the stream.
  struct EventMark final : QueueMark {
    cudaEvent_t e = nullptr;
    ~EventMark() override {
      if (e) cudaEventDestroy(e);
    }
  };
  std::unique_ptr<QueueMark> mark() override {
    auto m = std::make_unique<EventMark>();
    check(cudaEventCreate(&m->e), "mark", "cudaEventCreate");
    check(cudaEventRecord(m->e, stream_), "mark", "cudaEventRecord");
    return m;
  }
  static cudaEvent_t event_of(const QueueMark& m, const char* op) {
    const auto* e = dynamic_cast<const EventMark*>(&m);
    if (!e) throw Error(std::string("cuda ") + op + ": a mark from another backend");
    return e->e;
  }
  double seconds_between(const QueueMark& from, const QueueMark& to) override {
    cudaEvent_t a = event_of(from, "seconds_between"), b = event_of(to, "seconds_between");
    check(cudaEventSynchronize(b), "seconds_between", "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "seconds_between", "cudaEventElapsedTime");
    return 1e-3 * double(ms);
  }

  // Under the profiler (its events cannot sit in a capture) or DFLASH_CUDA_GRAPHS=0 the ops
  // launch one by one.
  bool records_steps() const override { return !prof_ && graphs_enabled(); }
  bool runs_ahead() const override { return true; }

  // Recorded as a CUDA graph (graph_recorder.h).
  void queue_recorded(const std::string& key, const std::function<void()>& step,
                      std::unique_ptr<QueueMark>* started) override {
    if (!records_steps()) return Backend::queue_recorded(key, step, started);
    graphs_->queue(key, step, [&] {
      if (started) *started = mark();
    });
  }

 private:
  // cuda::graph_probe and graph_counts (cuda_backend.h).
 public:
  GraphCounts graph_counts() const { return graphs_->counts(); }
  GraphProbe probe_graph(const std::function<void()>& step, int reps) {
    if (prof_)
      throw Error("graph_probe: DFLASH_CUDA_PROFILE=1 times every op with events, which a graph capture cannot "
                  "hold; probe without it");
    return graphs_->probe(step, reps);
  }

 private:
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;

  // Small host arrays (ids, positions) for one op, through the staging ring.
  std::shared_ptr<void> upload_ints(const std::vector<int32_t>& v, const char* op) {
    auto dev = pool_->allocate(v.size() * sizeof(int32_t), op);
    staging_->copy(v, dev.get(), op);
    return dev;
  }

  // The table's cos/sin on the device, uploaded again only when the table has grown (it
  // doubles, so that is rare) or is a different table at a reused address.
  const RopeEntry& rope_table(const RopeTable& table) {
    RopeEntry& e = rope_[&table];
    const bool same = e.cos && e.head_dim == table.head_dim() && e.scaling == table.attention_scaling() &&
                      e.inv_freq == table.inv_freq() && e.size >= table.size();
    if (same) return e;
    const size_t n = size_t(table.size()) * size_t(table.head_dim() / 2);
    e.cos = pool_->allocate_fresh(n * sizeof(float), "rope");
    e.sin = pool_->allocate_fresh(n * sizeof(float), "rope");
    if (n) {
      // On a stream of its own, waited for here: the compute stream may be capturing a graph
      // (queue_recorded), which cannot hold a copy from pageable memory. The new blocks come
      // fresh from the driver, so no queued kernel uses them; the old ones go back to the pool,
      // whose next user is queued behind the kernels that still read them.
      check(cudaMemcpyAsync(e.cos.get(), table.cos(0), n * sizeof(float), cudaMemcpyHostToDevice, upload_stream_),
            "rope", "uploading the cos table");
      check(cudaMemcpyAsync(e.sin.get(), table.sin(0), n * sizeof(float), cudaMemcpyHostToDevice, upload_stream_),
            "rope", "uploading the sin table");
      check(cudaStreamSynchronize(upload_stream_), "rope", "waiting for the table upload");
    }
    e.size = table.size();
    e.head_dim = table.head_dim();
    e.scaling = table.attention_scaling();
    e.inv_freq = table.inv_freq();
    return e;
  }

  std::shared_ptr<DevicePool> pool_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::shared_ptr<void> workspace_;
  std::map<const RopeTable*, RopeEntry> rope_;
  std::unique_ptr<OpProfiler> prof_;  // null unless DFLASH_CUDA_PROFILE=1
  std::unique_ptr<Timeline> timeline_;  // null unless DFLASH_CUDA_TIMELINE_OUT is set
  std::unique_ptr<StagingRing> staging_;
  std::unique_ptr<GraphRecorder> graphs_;  // queue_recorded's
  std::unique_ptr<IdReads> id_reads_;
  std::unique_ptr<ReadBack> read_back_;   // results the host waits for
  std::unique_ptr<SamplingOps> sampling_;
  cudaStream_t upload_stream_ = nullptr;  // RoPE tables: off the compute stream, which may be capturing
  // DFLASH_CUDA_TILED_WEIGHTS=1 (measuring): each matrix weight also kept pre-tiled for the
  // skinny products (kernels.h: skinny_tile_weight), keyed by its device pointer.
  struct TiledCopy {
    std::shared_ptr<void> data;
    int64_t rows = 0, cols = 0;
  };
  bool tile_weights_ = false;
  std::map<const void*, TiledCopy> tiled_;
  // matmul_add_norm's x_copy (a feature layer's rows) stored by the product's epilogue, not by a
  // copy after it: one launch fewer for each feature layer of a verification or prefill.
  // DFLASH_FEATURES_FROM_EPILOGUE=0 (measuring): the copy after the product, as before.
  bool features_in_epilogue_ = true;
  // The greedy choice inside the LM head's product (matmul_normed_argmax) and the embedding inside
  // the first norm (embed_fusable). Measuring knobs, read when the backend is made, as the one
  // above: DFLASH_FUSED_ARGMAX=0 runs the product then argmax_rows, DFLASH_FUSED_EMBED_NORM=0 the
  // embedding then the norm, as before.
  bool fuse_argmax_ = true;
  bool fuse_embed_norm_ = true;
};

int visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver / no device: not an error for the caller, just no GPU
    return 0;
  }
  return n;
}

}  // namespace

std::string device_summary() {
  if (visible_devices() == 0) return "";
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, 0), "doctor", "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s, %d SMs, %.1f GiB, sm_%d%d, L2 %d MiB, driver %d.%d, runtime %d.%d", p.name,
                p.multiProcessorCount, double(p.totalGlobalMem) / double(1 << 30), p.major, p.minor,
                p.l2CacheSize >> 20, driver / 1000, (driver % 1000) / 10, runtime / 1000, (runtime % 1000) / 10);
  return buf;
}

GraphProbe graph_probe(Backend& backend, const std::function<void()>& step, int reps) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (!cuda) throw Error("graph_probe: the backend is " + backend.name() + ", not cuda");
  return cuda->probe_graph(step, std::max(1, reps));
}

GraphCounts graph_counts(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  return cuda ? cuda->graph_counts() : GraphCounts{};
}

double copy_bandwidth(size_t bytes) {
  const DeviceBuffer a_buf(bytes, "bandwidth"), b_buf(bytes, "bandwidth");
  void *const a = a_buf.as(), *const b = b_buf.as();
  // Random-ish contents rather than zeros (compressible data can read faster than real data).
  std::vector<uint32_t> pattern(1 << 20);
  uint32_t s = 12345;
  for (auto& v : pattern) v = s = s * 1664525u + 1013904223u;
  for (size_t off = 0; off < bytes; off += pattern.size() * 4)
    check(cudaMemcpy(static_cast<char*>(a) + off, pattern.data(), std::min(bytes - off, pattern.size() * 4),
                     cudaMemcpyHostToDevice),
          "bandwidth", "fill");
  // Bytes read + written: twice the buffer per copy, the direction alternating.
  const double best = best_timed_rate(8, 2.0 * double(bytes), [&](int rep) {
    check(cudaMemcpyAsync(rep % 2 ? a : b, rep % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice), "bandwidth",
          "device to device copy");
  });
  return best;
}

bool has_tiled_copy(const Backend& b, const Tensor& w) {
  const auto* c = dynamic_cast<const CudaBackend*>(&b);
  return c && c->tiled_for(w) != nullptr;
}

bool features_in_epilogue(const Backend& b) {
  const auto* c = dynamic_cast<const CudaBackend*>(&b);
  return c && c->features_in_epilogue();
}

bool fuses_embed_norm(const Backend& b, const Tensor& table, const Tensor& x, const Tensor& norm_w,
                      const NormedRows& out) {
  const auto* c = dynamic_cast<const CudaBackend*>(&b);
  return c && c->embed_fusable(table, x, norm_w, out);
}

bool fuses_argmax(const Backend& b, const Tensor& h, const Tensor& w) {
  const auto* c = dynamic_cast<const CudaBackend*>(&b);
  return c && c->argmax_fusable(h, w);
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend() {
  if (cuda::visible_devices() == 0) return nullptr;
  return std::make_unique<cuda::CudaBackend>();
}

}  // namespace dflash
