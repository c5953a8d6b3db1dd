// The CPU backend: f32 activations and weights (bf16/f16 checkpoints are widened once at
// load), OpenBLAS for the matrix products, OpenMP for the loops that are not matrix products.
#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "backend/backend.h"
#include "util/error.h"

namespace dflash {

namespace {

Tensor make_host_tensor(int64_t rows, int64_t cols, DType dtype) {
  Tensor t;
  const size_t bytes = std::max<size_t>(1, rows * cols * dtype_size(dtype));
  // 64-byte alignment keeps AVX-512 loads on one cache line.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes");
  t.storage = std::shared_ptr<void>(p, std::free);
  t.data = p;
  t.dtype = dtype;
  t.device = DeviceKind::CPU;
  t.rows = rows;
  t.cols = cols;
  t.ld = cols;
  return t;
}

void check_f32(const Tensor& t, const char* op) {
  if (t.dtype != DType::F32) throw Error(std::string("cpu ") + op + ": expected F32, got " + t.describe());
}

// y[m, n] (+)= Σ_k x[m, k] · w[n, k] with bf16 w, for a few rows of x: each weight row is
// streamed from memory once and widened in registers; this loop is what decode time is.
// Rows of x are taken MT at a time against two weight rows, so every x load feeds two FMAs.
template <int MT>
inline void skinny_tile_bf16(const float* const* xs, const uint16_t* w0, const uint16_t* w1, int64_t K,
                             float* out0, float* out1) {
  int64_t k = 0;
#ifdef __AVX512F__
  __m512 a0[MT], a1[MT];
  for (int i = 0; i < MT; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
  for (; k + 16 <= K; k += 16) {
    // Ask for the rows four pairs ahead now: one thread's stream of loads alone does not keep
    // enough requests in flight to reach the memory's bandwidth.
    _mm_prefetch(reinterpret_cast<const char*>(w0 + k + 8 * K), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w1 + k + 8 * K), _MM_HINT_T0);
    const __m512 v0 = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + k))), 16));
    const __m512 v1 = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w1 + k))), 16));
    for (int i = 0; i < MT; ++i) {
      const __m512 xv = _mm512_loadu_ps(xs[i] + k);
      a0[i] = _mm512_fmadd_ps(v0, xv, a0[i]);
      a1[i] = _mm512_fmadd_ps(v1, xv, a1[i]);
    }
  }
  for (int i = 0; i < MT; ++i) {
    out0[i] = _mm512_reduce_add_ps(a0[i]);
    out1[i] = _mm512_reduce_add_ps(a1[i]);
  }
#else
  for (int i = 0; i < MT; ++i) out0[i] = out1[i] = 0.f;
#endif
  for (; k < K; ++k) {
    const float f0 = bf16_to_f32(w0[k]), f1 = bf16_to_f32(w1[k]);
    for (int i = 0; i < MT; ++i) {
      out0[i] += f0 * xs[i][k];
      out1[i] += f1 * xs[i][k];
    }
  }
}

template <int M>
void skinny_matmul_bf16(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) {
  constexpr int kFirst = M < 8 ? M : 8, kSecond = M - kFirst;
  const int64_t K = w.cols, N = w.rows;
  const float* xs[M];
  for (int m = 0; m < M; ++m) xs[m] = x.ptr<float>() + m * x.ld;
  const int64_t pairs = (N + 1) / 2;
#pragma omp parallel for schedule(static) if (N * K > (1 << 16))
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t n0 = 2 * p, n1 = std::min(n0 + 1, N - 1);  // odd N: the last row twice
    const uint16_t* w0 = w.ptr<uint16_t>() + n0 * w.ld;
    const uint16_t* w1 = w.ptr<uint16_t>() + n1 * w.ld;
    float r0[M], r1[M];
    skinny_tile_bf16<kFirst>(xs, w0, w1, K, r0, r1);
    if constexpr (kSecond > 0) skinny_tile_bf16<kSecond>(xs + kFirst, w0, w1, K, r0 + kFirst, r1 + kFirst);
    for (int m = 0; m < M; ++m) {
      float* out = y.ptr<float>() + m * y.ld;
      out[n0] = accumulate ? out[n0] + r0[m] : r0[m];
      if (n1 != n0) out[n1] = accumulate ? out[n1] + r1[m] : r1[m];
    }
  }
}

// Many rows: widen a band of weight rows to f32 and let BLAS multiply it; the widening is
// paid once per band for all rows of x.
void banded_matmul_bf16(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) {
  const int64_t K = w.cols, band = std::max<int64_t>(64, (int64_t(1) << 22) / std::max<int64_t>(K, 1));
  std::vector<float> buf(size_t(std::min(band, w.rows) * K));
  for (int64_t n0 = 0; n0 < w.rows; n0 += band) {
    const int64_t nb = std::min(band, w.rows - n0);
#pragma omp parallel for schedule(static) if (nb * K > (1 << 16))
    for (int64_t r = 0; r < nb; ++r)
      convert_to_f32(DType::BF16, w.ptr<uint16_t>() + (n0 + r) * w.ld, buf.data() + r * K, K);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, x.rows, nb, K, 1.0f, x.ptr<float>(), x.ld, buf.data(), K,
                accumulate ? 1.0f : 0.0f, y.ptr<float>() + n0, y.ld);
  }
}

template <int... Ms>
void skinny_dispatch(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate, std::integer_sequence<int, Ms...>) {
  ((x.rows == Ms + 1 ? (skinny_matmul_bf16<Ms + 1>(x, w, y, accumulate), true) : false) || ...);
}

// Up to a verification block of rows, streaming each weight once and keeping one accumulator
// per row in registers beats widening the weights for BLAS; beyond that BLAS wins.
constexpr int kMaxSkinnyRows = 16;

void matmul_bf16(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) {
  if (x.rows <= kMaxSkinnyRows)
    skinny_dispatch(x, w, y, accumulate, std::make_integer_sequence<int, kMaxSkinnyRows>{});
  else
    banded_matmul_bf16(x, w, y, accumulate);
}

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  DeviceKind device() const override { return DeviceKind::CPU; }
  DType activation_dtype() const override { return DType::F32; }

  Tensor alloc(int64_t rows, int64_t cols, DType dtype) override {
    return make_host_tensor(rows, cols, dtype);
  }

  // 2-D bf16 weights stay bf16 (half the bytes to stream per token; widened inside the
  // matrix kernels); everything else is widened to f32 once here.
  Tensor upload_weight(const std::vector<const TensorInfo*>& parts) override {
    const FusedWeightShape shape = fused_weight_shape(parts);
    const bool keep_bf16 = shape.all_bf16 && shape.all_matrices;
    Tensor t = make_host_tensor(shape.rows, shape.cols, keep_bf16 ? DType::BF16 : DType::F32);
    char* dst = static_cast<char*>(t.data);
    for (const auto* p : parts) {
      if (keep_bf16) {
        std::memcpy(dst, p->data, p->nbytes);
        dst += p->nbytes;
      } else {
        convert_to_f32(p->dtype, p->data, reinterpret_cast<float*>(dst), p->numel());
        dst += p->numel() * sizeof(float);
      }
    }
    return t;
  }

  Tensor upload(const float* host, int64_t rows, int64_t cols) override {
    Tensor t = make_host_tensor(rows, cols, DType::F32);
    std::memcpy(t.data, host, rows * cols * sizeof(float));
    return t;
  }

  void download(const Tensor& t, float* host) override {
    check_f32(t, "download");
    for (int64_t r = 0; r < t.rows; ++r)
      std::memcpy(host + r * t.cols, t.ptr<float>() + r * t.ld, t.cols * sizeof(float));
  }

  void matmul(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) override {
    check_f32(x, "matmul");
    check_f32(y, "matmul");
    if (x.cols != w.cols || y.rows != x.rows || y.cols != w.rows)
      throw Error("cpu matmul: shapes " + x.describe() + " · " + w.describe() + "ᵀ → " + y.describe());
    if (w.dtype == DType::BF16) {
      matmul_bf16(x, w, y, accumulate);
      return;
    }
    check_f32(w, "matmul");
    if (x.rows == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, w.rows, w.cols, 1.0f, w.ptr<float>(), w.ld,
                  x.ptr<float>(), 1, accumulate ? 1.0f : 0.0f, y.ptr<float>(), 1);
      return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, x.rows, w.rows, x.cols, 1.0f, x.ptr<float>(),
                x.ld, w.ptr<float>(), w.ld, accumulate ? 1.0f : 0.0f, y.ptr<float>(), y.ld);
  }

  void rms_norm(const Tensor& x, const Tensor& w, float eps, int64_t group, Tensor& y) override {
    check_f32(x, "rms_norm");
    if (x.cols % group || w.numel() != group)
      throw Error("cpu rms_norm: " + x.describe() + " with groups of " + std::to_string(group));
    const int64_t groups = x.cols / group;
    const float* wp = w.ptr<float>();
#pragma omp parallel for collapse(2) if (x.rows * x.cols > (1 << 16))
    for (int64_t r = 0; r < x.rows; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const float* in = x.ptr<float>() + r * x.ld + g * group;
        float* out = y.ptr<float>() + r * y.ld + g * group;
        float ss = 0.f;
        for (int64_t i = 0; i < group; ++i) ss += in[i] * in[i];
        const float inv = 1.0f / std::sqrt(ss / static_cast<float>(group) + eps);
        for (int64_t i = 0; i < group; ++i) out[i] = wp[i] * (in[i] * inv);
      }
    }
  }

  void rope(Tensor& x, const std::vector<int32_t>& positions, int64_t head_dim,
            const RopeTable& table) override {
    check_f32(x, "rope");
    if (static_cast<int64_t>(positions.size()) != x.rows)
      throw Error("cpu rope: " + std::to_string(positions.size()) + " positions for " + x.describe());
    const int64_t half = head_dim / 2, heads = x.cols / head_dim;
    for (int64_t r = 0; r < x.rows; ++r) {
      if (positions[r] < 0 || positions[r] >= table.size()) throw Error("cpu rope: position outside the table");
      const float* c = table.cos(positions[r]);
      const float* s = table.sin(positions[r]);
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x.ptr<float>() + r * x.ld + h * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * c[i] - b * s[i];
          v[i + half] = b * c[i] + a * s[i];
        }
      }
    }
  }

  // Per query head: scores = q_h · k_hᵀ and out_h = softmax(scores) · v_h as two BLAS products
  // over strided views (rows of one head are ld apart), heads spread over threads.
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t kv_len, int64_t q_pos0,
                 int64_t head_dim, AttentionMask mask, Tensor& out) override {
    check_f32(q, "attention");
    const int64_t hq = q.cols / head_dim, hkv = k.cols / head_dim, group = hq / hkv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    const int64_t T = q.rows;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const bool parallel = T * hq * kv_len * head_dim > (1 << 16);
#pragma omp parallel if (parallel)
    {
      std::vector<float> scores(size_t(T * kv_len));
#pragma omp for schedule(static)
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t kvh = h / group;
        const float* qh = q.ptr<float>() + h * head_dim;
        const float* kh = k.ptr<float>() + kvh * head_dim;
        const float* vh = v.ptr<float>() + kvh * head_dim;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, kv_len, head_dim, scale, qh, q.ld, kh, k.ld, 0.0f,
                    scores.data(), kv_len);
        for (int64_t t = 0; t < T; ++t) {
          float* row = scores.data() + t * kv_len;
          const int64_t visible = mask == AttentionMask::Causal ? std::min(kv_len, q_pos0 + t + 1) : kv_len;
          float mx = neg_inf;
          for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, row[j]);
          float sum = 0.f;
          for (int64_t j = 0; j < visible; ++j) {
            row[j] = std::exp(row[j] - mx);
            sum += row[j];
          }
          const float inv = 1.0f / sum;
          for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
          for (int64_t j = visible; j < kv_len; ++j) row[j] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, head_dim, kv_len, 1.0f, scores.data(), kv_len, vh,
                    v.ld, 0.0f, out.ptr<float>() + h * head_dim, out.ld);
      }
    }
  }

  void silu_mul(const Tensor& gate_up, Tensor& out) override {
    const int64_t I = out.cols;
#pragma omp parallel for if (out.numel() > (1 << 16))
    for (int64_t r = 0; r < out.rows; ++r) {
      const float* g = gate_up.ptr<float>() + r * gate_up.ld;
      const float* u = g + I;
      float* o = out.ptr<float>() + r * out.ld;
      for (int64_t i = 0; i < I; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  }

  void embed(const std::vector<int32_t>& ids, const Tensor& table, Tensor& out) override {
    for (size_t r = 0; r < ids.size(); ++r) {
      if (ids[r] < 0 || ids[r] >= table.rows)
        throw Error("token id " + std::to_string(ids[r]) + " is outside the embedding table (" +
                    std::to_string(table.rows) + " rows)");
      float* dst = out.ptr<float>() + r * out.ld;
      if (table.dtype == DType::BF16)
        convert_to_f32(DType::BF16, table.ptr<uint16_t>() + ids[r] * table.ld, dst, table.cols);
      else
        std::memcpy(dst, table.ptr<float>() + ids[r] * table.ld, table.cols * sizeof(float));
    }
  }

  void copy(const Tensor& src, Tensor& dst) override {
    if (src.rows != dst.rows || src.cols != dst.cols)
      throw Error("cpu copy: " + src.describe() + " → " + dst.describe());
    for (int64_t r = 0; r < src.rows; ++r)
      std::memcpy(dst.ptr<float>() + r * dst.ld, src.ptr<float>() + r * src.ld, src.cols * sizeof(float));
  }

  void add(const Tensor& x, Tensor& y) override {
    for (int64_t r = 0; r < x.rows; ++r) {
      const float* a = x.ptr<float>() + r * x.ld;
      float* b = y.ptr<float>() + r * y.ld;
      for (int64_t i = 0; i < x.cols; ++i) b[i] += a[i];
    }
  }

  std::vector<int32_t> argmax_rows(const Tensor& x) override {
    std::vector<int32_t> out(x.rows);
    for (int64_t r = 0; r < x.rows; ++r) {
      const float* p = x.ptr<float>() + r * x.ld;
      out[r] = static_cast<int32_t>(std::max_element(p, p + x.cols) - p);
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

#ifndef DFLASH_CUDA
std::unique_ptr<Backend> make_cuda_backend() { return nullptr; }
#endif

std::unique_ptr<Backend> make_backend(const std::string& which) {
  if (which == "cpu") return make_cpu_backend();
  if (which == "cuda" || which == "auto") {
    auto b = make_cuda_backend();
    if (b) return b;
    if (which == "cuda") throw Error("--device cuda: this build has no CUDA backend or no GPU is visible");
    return make_cpu_backend();
  }
  throw Error("unknown device '" + which + "' (cpu, cuda, auto)");
}

}  // namespace dflash
