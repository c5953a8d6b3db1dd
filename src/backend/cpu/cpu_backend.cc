// The CPU backend: f32 activations; bf16 matrices kept bf16 in row panels (bf16_panels.h),
// everything else widened to f32 at load. Decode and verification products run the packed
// kernel, prefill products and attention run OpenBLAS, the other loops OpenMP.
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
#include "backend/cpu/bf16_panels.h"
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

// Many rows (prefill): widen a band of the packed weight to f32 and let BLAS multiply it; the
// widening is paid once per band for all rows of x.
void banded_matmul_bf16(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) {
  const int64_t K = w.cols;
  const int64_t band = std::max<int64_t>(64, (int64_t(1) << 22) / std::max<int64_t>(K, 1)) / kPanelRows * kPanelRows;
  std::vector<float> buf(size_t(std::min(band, w.rows) * K));
  for (int64_t n0 = 0; n0 < w.rows; n0 += band) {
    const int64_t nb = std::min(band, w.rows - n0);
    unpack_rows_to_f32(w, n0, nb, buf.data());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, x.rows, nb, K, 1.0f, x.ptr<float>(), x.ld, buf.data(), K,
                accumulate ? 1.0f : 0.0f, y.ptr<float>() + n0, y.ld);
  }
}

// Decode and verification rows stream the weight once through the packed kernel, which is
// also what keeps a verified row bit-identical to the same row decoded alone.
void matmul_bf16(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) {
  if (x.rows <= kPackedMaxRows)
    packed_matmul(x, w, y, accumulate);
  else
    banded_matmul_bf16(x, w, y, accumulate);
}

#ifdef __AVX512F__
// e^x for 16 lanes: 2^(x·log2 e) split into an integer power (placed in the exponent bits) and
// 2^f for f in [−½, ½] from a degree-6 polynomial; relative error ≈ 2e-7, about one float
// ulp. Inputs beyond ±87 saturate to 0 and +inf as expf does.
inline __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-88.0f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147180559945309f));  // f·ln 2
  // e^y for |y| ≤ ln2/2, Taylor to y^6.
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);  // p · 2^n, exact, with overflow to inf and underflow to 0
}
#endif

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  DeviceKind device() const override { return DeviceKind::CPU; }
  DType activation_dtype() const override { return DType::F32; }

  Tensor alloc(int64_t rows, int64_t cols, DType dtype) override {
    return make_host_tensor(rows, cols, dtype);
  }

  // 2-D bf16 weights stay bf16 (half the bytes to stream per token; widened inside the
  // matrix kernel), packed in row panels; everything else is widened to f32 once here.
  Tensor upload_weight(const std::vector<const TensorInfo*>& parts) override {
    const FusedWeightShape shape = fused_weight_shape(parts);
    if (shape.all_bf16 && shape.all_matrices) {
      Tensor t = make_host_tensor(1, packed_bf16_bytes(shape.rows, shape.cols) / 2, DType::BF16);
      pack_bf16_panels(parts, shape.cols, t.ptr<uint16_t>());
      t.rows = shape.rows;
      t.cols = t.ld = shape.cols;
      t.packed = true;
      return t;
    }
    Tensor t = make_host_tensor(shape.rows, shape.cols, DType::F32);
    float* dst = t.ptr<float>();
    for (const auto* p : parts) {
      convert_to_f32(p->dtype, p->data, dst, p->numel());
      dst += p->numel();
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
    if (w.packed) {
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
          int64_t j = 0;
#ifdef __AVX512F__
          // Vector exp: scalar expf was a tenth of a long-context verification step.
          __m512 acc = _mm512_setzero_ps();
          const __m512 mv = _mm512_set1_ps(mx);
          for (; j + 16 <= visible; j += 16) {
            const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(row + j), mv));
            _mm512_storeu_ps(row + j, e);
            acc = _mm512_add_ps(acc, e);
          }
          sum = _mm512_reduce_add_ps(acc);
#endif
          for (; j < visible; ++j) {
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
      int64_t i = 0;
#ifdef __AVX512F__
      // A scalar expf per element cost as much as the whole down projection at 16 rows.
      for (; i + 16 <= I; i += 16) {
        const __m512 gv = _mm512_loadu_ps(g + i);
        const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        const __m512 silu = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(o + i, _mm512_mul_ps(silu, _mm512_loadu_ps(u + i)));
      }
#endif
      for (; i < I; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  }

  void embed(const std::vector<int32_t>& ids, const Tensor& table, Tensor& out) override {
    for (size_t r = 0; r < ids.size(); ++r) {
      if (ids[r] < 0 || ids[r] >= table.rows)
        throw Error("token id " + std::to_string(ids[r]) + " is outside the embedding table (" +
                    std::to_string(table.rows) + " rows)");
      float* dst = out.ptr<float>() + r * out.ld;
      if (table.packed)
        packed_row_to_f32(table, ids[r], dst);
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
