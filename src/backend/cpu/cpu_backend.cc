// The CPU backend: f32 activations; bf16 matrices kept bf16 in row panels (bf16_panels.h),
// everything else widened to f32 at load. Decode and verification products run the packed
// kernel, prefill products and attention run OpenBLAS, the other loops OpenMP.
#include <cblas.h>
// GCC 12 reports its own AVX-512 intrinsics (_mm512_min_ps and kin, whose pass-through operand
// is deliberately undefined) as "may be used uninitialized" wherever they are inlined; the
// report points into the header, so that is where it is silenced.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "backend/backend.h"
#include "backend/cpu/amx_panels.h"
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
void banded_matmul_packed(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) {
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
// also what keeps a verified row bit-identical to the same row decoded alone. On AMX a prompt's
// rows take the same kernel, 32 rows a pass over the weight (a 234-token prompt of the embedded
// target: 18.3 against 42.3 ms through BLAS in the same run, docs/benchmarks.md).
void matmul_packed(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) {
  if (w.dtype == DType::BF16 && amx_panels_active())
    amx_panel_matmul(x, w, y, accumulate);
  else if (x.rows <= kPackedMaxRows)
    packed_matmul(x, w, y, accumulate);
  else
    banded_matmul_packed(x, w, y, accumulate);
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
#elif defined(__AVX2__) && defined(__FMA__)
// exp_avx512's 8-lane twin: the same polynomial; 2^n is built in the exponent bits, so where
// n = −127 (x near −88) it gives 0 where scalef gives a subnormal.
inline __m256 exp_avx2(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-88.0f));
  const __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_mul_ps(_mm256_sub_ps(t, n), _mm256_set1_ps(0.693147180559945309f));
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
#endif

// row[j] ← exp(row[j] − max) over the first n entries; returns 1 / Σ (0 when n is 0).
inline float softmax_numerators(float* row, int64_t n) {
  if (n <= 0) return 0.f;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, row[j]);
  float sum = 0.f;
  int64_t j = 0;
#ifdef __AVX512F__
  __m512 acc = _mm512_setzero_ps();
  const __m512 mv = _mm512_set1_ps(mx);
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(row + j), mv));
    _mm512_storeu_ps(row + j, e);
    acc = _mm512_add_ps(acc, e);
  }
  sum = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  const __m256 mv = _mm256_set1_ps(mx);
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(row + j), mv));
    _mm256_storeu_ps(row + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (float l : lanes) sum += l;
#endif
  for (; j < n; ++j) {
    row[j] = std::exp(row[j] - mx);
    sum += row[j];
  }
  return 1.0f / sum;
}

// Σ_d a[d]·b[d] in 16-lane chunks, then one fixed reduction.
inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.f;
#ifdef __AVX512F__
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
    i = n;
  }
  sum = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (float l : lanes) sum += l;
#endif
  for (; i < n; ++i) sum = std::fma(a[i], b[i], sum);
  return sum;
}

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
// out[0 … 8·NV) += Σ_j p[j] · v[j·ldv …], the accumulators in registers (AVX2: 16 of them, so
// at most 8 a pass).
template <int NV>
void weighted_sum_regs8(const float* p, int64_t n, const float* v, int64_t ldv, float* out) {
  __m256 a[NV];
  for (int i = 0; i < NV; ++i) a[i] = _mm256_loadu_ps(out + 8 * i);
  for (int64_t j = 0; j < n; ++j) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    for (int i = 0; i < NV; ++i) a[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + j * ldv + 8 * i), a[i]);
  }
  for (int i = 0; i < NV; ++i) _mm256_storeu_ps(out + 8 * i, a[i]);
}
#endif

#ifdef __AVX512F__
// out[0 … 16·NV) += Σ_j p[j] · v[j·ldv …], the accumulators in registers (a chain through memory
// cost a store-forwarding round trip per key).
template <int NV>
void weighted_sum_regs(const float* p, int64_t n, const float* v, int64_t ldv, float* out) {
  __m512 a[NV];
  for (int i = 0; i < NV; ++i) a[i] = _mm512_loadu_ps(out + 16 * i);
  for (int64_t j = 0; j < n; ++j) {
    const __m512 pj = _mm512_set1_ps(p[j]);
    for (int i = 0; i < NV; ++i) a[i] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(v + j * ldv + 16 * i), a[i]);
  }
  for (int i = 0; i < NV; ++i) _mm512_storeu_ps(out + 16 * i, a[i]);
}
#endif

// y += p · x.
inline void axpy(float p, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#ifdef __AVX512F__
  const __m512 pv = _mm512_set1_ps(p);
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(pv, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(pv, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    i = n;
  }
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 pv = _mm256_set1_ps(p);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(pv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] = std::fma(p, x[i], y[i]);
}

// out[d] += Σ_j p[j] · v[j·ldv + d], summed over j in order for every d.
inline void weighted_sum(const float* p, int64_t n, const float* v, int64_t ldv, int64_t D, float* out) {
#ifdef __AVX512F__
  switch (D) {
    case 32: return weighted_sum_regs<2>(p, n, v, ldv, out);
    case 64: return weighted_sum_regs<4>(p, n, v, ldv, out);
    case 96: return weighted_sum_regs<6>(p, n, v, ldv, out);
    case 128: return weighted_sum_regs<8>(p, n, v, ldv, out);
    case 256: return weighted_sum_regs<16>(p, n, v, ldv, out);
    default: break;
  }
#elif defined(__AVX2__) && defined(__FMA__)
  // Each out[d] is the same chain over j however d is split into passes of 64.
  if (D % 32 == 0) {
    for (int64_t d = 0; d < D; d += 64) {
      if (D - d >= 64) weighted_sum_regs8<8>(p, n, v + d, ldv, out + d);
      else weighted_sum_regs8<4>(p, n, v + d, ldv, out + d);
    }
    return;
  }
#endif
  for (int64_t j = 0; j < n; ++j) axpy(p[j], v + j * ldv, out, D);
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
  // matrix kernel), packed in row panels; other matrices become f32 panels, vectors f32.
  Tensor upload_weight(const std::vector<const TensorInfo*>& parts) override {
    const FusedWeightShape shape = fused_weight_shape(parts);
    if (shape.all_matrices) {  // bf16 panels, or f32 panels for f32/f16: the same kernel and order
      const bool bf16 = shape.all_bf16;
      const int64_t bytes = bf16 ? packed_bf16_bytes(shape.rows, shape.cols) : packed_f32_bytes(shape.rows, shape.cols);
      const DType dtype = bf16 ? DType::BF16 : DType::F32;
      Tensor t = make_host_tensor(1, bytes / int64_t(dtype_size(dtype)), dtype);
      if (bf16) pack_bf16_panels(parts, shape.cols, t.ptr<uint16_t>());
      else pack_f32_panels(parts, shape.cols, t.ptr<float>());
      t.rows = shape.rows;
      t.cols = t.ld = shape.cols;
      t.packed = true;
      t.weight = true;
      return t;
    }
    Tensor t = make_host_tensor(shape.rows, shape.cols, DType::F32);
    float* dst = t.ptr<float>();
    for (const auto* p : parts) {
      convert_to_f32(p->dtype, p->data, dst, p->numel());
      dst += p->numel();
    }
    t.weight = true;
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
      matmul_packed(x, w, y, accumulate);
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

  // Per (query head, tile of up to four rows): each key and value row is loaded once for the
  // tile, scores are dot products over d, then a softmax and P·V summed over keys in order.
  // Every sum a row makes runs in an order fixed by the row alone (its query, its visible key
  // count), so a row verified in a block is bit-identical to the same row decoded alone, as in
  // the matrix products. (Per-head BLAS calls did not promise that, and their packing cost a
  // quarter of a verification step at these sizes.)
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t kv_len, int64_t q_pos0,
                 int64_t head_dim, AttentionMask mask, Tensor& out) override {
    check_f32(q, "attention");
    const int64_t D = head_dim, hq = q.cols / D, hkv = k.cols / D, group = hq / hkv, T = q.rows;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    constexpr int64_t kRowTile = 4;
    const int64_t tiles = (T + kRowTile - 1) / kRowTile;
    const bool parallel = T * hq * kv_len * D > (1 << 15);
#pragma omp parallel for collapse(2) schedule(static) if (parallel)
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t tile = 0; tile < tiles; ++tile) {
        const int64_t t0 = tile * kRowTile, rows = std::min(kRowTile, T - t0), kvh = h / group;
        thread_local std::vector<float> scores, acc;
        scores.resize(size_t(kRowTile * std::max<int64_t>(kv_len, 1)));
        acc.assign(size_t(kRowTile * D), 0.0f);
        int64_t visible[kRowTile];
        int64_t most = 0;
        const float* qr[kRowTile];
        for (int64_t r = 0; r < rows; ++r) {
          visible[r] = mask == AttentionMask::Causal ? std::min(kv_len, q_pos0 + t0 + r + 1) : kv_len;
          most = std::max(most, visible[r]);
          qr[r] = q.ptr<float>() + (t0 + r) * q.ld + h * D;
        }
        for (int64_t j = 0; j < most; ++j) {
          const float* kr = k.ptr<float>() + j * k.ld + kvh * D;
          for (int64_t r = 0; r < rows; ++r)
            if (j < visible[r]) scores[size_t(r * kv_len + j)] = dot(qr[r], kr, D) * scale;
        }
        float inv_sum[kRowTile];
        for (int64_t r = 0; r < rows; ++r) inv_sum[r] = softmax_numerators(scores.data() + r * kv_len, visible[r]);
        for (int64_t r = 0; r < rows; ++r)
          weighted_sum(scores.data() + r * kv_len, visible[r], v.ptr<float>() + kvh * D, v.ld, D, acc.data() + r * D);
        for (int64_t r = 0; r < rows; ++r) {
          float* o = out.ptr<float>() + (t0 + r) * out.ld + h * D;
          for (int64_t d = 0; d < D; ++d) o[d] = acc[size_t(r * D + d)] * inv_sum[r];
        }
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
#elif defined(__AVX2__) && defined(__FMA__)
      for (; i + 8 <= I; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        const __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
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

  void apply_penalties(Tensor& logits, const PenaltyTokens& t) override {
    check_penalty_tokens(logits, t);
    for (int64_t r = 0; r + 1 < int64_t(t.row_first.size()); ++r) penalise_row(logits.ptr<float>() + r * logits.ld, r, t);
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
