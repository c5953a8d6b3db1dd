#include "backend/cpu/bf16_panels.h"

// GCC 12's false "may be used uninitialized" reports inside its own AVX-512 headers: see
// cpu_backend.cc.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "util/dtype.h"
#include "util/error.h"

namespace dflash {

namespace {

constexpr int64_t kPrefetchAhead = 64;  // k steps: 2 KB ahead in a panel

int64_t panel_count(int64_t rows) { return (rows + kPanelRows - 1) / kPanelRows; }

// Columns a panel holds (its stride is that many times kPanelRows elements).
template <typename W>
int64_t panel_cols(int64_t cols) {
  return sizeof(W) == 2 ? bf16_panel_cols(cols) : cols;
}

template <typename W>
const W* panel_base(const Tensor& w, int64_t panel) {
  return w.ptr<W>() + panel * panel_cols<W>(w.cols) * kPanelRows;
}

// Where w[n0 + i, k] lies from its panel's start: bf16 panels hold columns in pairs.
template <typename W>
int64_t panel_offset(int64_t k, int64_t i) {
  return sizeof(W) == 2 ? (k / 2) * 2 * kPanelRows + i * 2 + k % 2 : k * kPanelRows + i;
}

inline float weight_f32(uint16_t v) { return bf16_to_f32(v); }
inline float weight_f32(float v) { return v; }

// MR rows of x, interleaved by k (xt[k·MR + m]), against P consecutive panels (16·P outputs
// per row). Interleaving puts every x value a k step needs in one cache line at fixed offsets
// from one pointer, so each FMA takes its broadcast operand straight from memory. Each
// (m, panel) accumulator is a chain of FMAs over k; P panels side by side keep enough
// independent chains in flight when MR is small. bf16 panels are walked a column pair (one
// line) at a time, column k before k + 1, so the chains are the same as one column a step.
// Each kernel is a struct: its tile function and its panels per tile by rows (enough FMA chains
// to cover the FMA latency, few enough registers). Every one sums each output over k in
// ascending order in one f32 lane, so all of them give the same bits (bf16_panels.h).
struct ScalarTiles {
  static constexpr int panels_for(int) { return 1; }
  template <typename W, int MR, int P>
  static void tile(const float* xt, const W* wp, int64_t K, float* const* ys, int64_t n0, int64_t N,
                   bool accumulate) {
    const int64_t stride = panel_cols<W>(K) * kPanelRows;  // elements from one panel to the next
    for (int p = 0; p < P; ++p)
      for (int i = 0; i < kPanelRows; ++i) {
        const int64_t n = n0 + p * kPanelRows + i;
        if (n >= N) break;
        for (int m = 0; m < MR; ++m) {
          float s = 0.f;
          for (int64_t k = 0; k < K; ++k) s = std::fma(xt[k * MR + m], weight_f32(wp[p * stride + panel_offset<W>(k, i)]), s);
          ys[m][n] = accumulate ? ys[m][n] + s : s;
        }
      }
  }
};

#ifdef __AVX512F__
struct Avx512Tiles {
  static constexpr int panels_for(int rows) { return rows <= 2 ? 4 : rows <= 4 ? 2 : 1; }
  template <typename W, int MR, int P>
  static void tile(const float* xt, const W* wp, int64_t K, float* const* ys, int64_t n0, int64_t N,
                   bool accumulate) {
    const int64_t stride = panel_cols<W>(K) * kPanelRows;  // elements from one panel to the next
    __m512 acc[P][MR];
    for (int p = 0; p < P; ++p)
      for (int m = 0; m < MR; ++m) acc[p][m] = _mm512_setzero_ps();
    if constexpr (sizeof(W) == 2) {
      const __m512i high = _mm512_set1_epi32(int(0xffff0000u));
      for (int64_t k = 0; k < K; k += 2) {
        const float* xk = xt + k * MR;
        const bool pair = k + 1 < K;
        for (int p = 0; p < P; ++p) {
          // The weights stream from memory: the hardware prefetcher alone keeps too few lines in
          // flight for one stream per thread (measured: loads were 60% of a verification step).
          _mm_prefetch(reinterpret_cast<const char*>(wp + p * stride + (k + kPrefetchAhead) * kPanelRows), _MM_HINT_T0);
          const __m512i line = _mm512_loadu_si512(wp + p * stride + k * kPanelRows);
          const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(line, 16));  // column k: the low halves
          for (int m = 0; m < MR; ++m) acc[p][m] = _mm512_fmadd_ps(_mm512_set1_ps(xk[m]), w0, acc[p][m]);
          if (pair) {
            const __m512 w1 = _mm512_castsi512_ps(_mm512_and_si512(line, high));  // column k + 1
            for (int m = 0; m < MR; ++m) acc[p][m] = _mm512_fmadd_ps(_mm512_set1_ps(xk[MR + m]), w1, acc[p][m]);
          }
        }
      }
    } else {
      for (int64_t k = 0; k < K; ++k) {
        const float* xk = xt + k * MR;
        for (int p = 0; p < P; ++p) {
          _mm_prefetch(reinterpret_cast<const char*>(wp + p * stride + (k + kPrefetchAhead) * kPanelRows), _MM_HINT_T0);
          const __m512 wv = _mm512_loadu_ps(wp + p * stride + k * kPanelRows);
          for (int m = 0; m < MR; ++m) acc[p][m] = _mm512_fmadd_ps(_mm512_set1_ps(xk[m]), wv, acc[p][m]);
        }
      }
    }
    for (int p = 0; p < P; ++p) {
      const int64_t n = n0 + p * kPanelRows;
      if (n >= N) break;
      const __mmask16 mask = N - n >= kPanelRows ? __mmask16(0xffff) : __mmask16((1u << (N - n)) - 1);
      for (int m = 0; m < MR; ++m) {
        __m512 v = acc[p][m];
        if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, ys[m] + n));
        _mm512_mask_storeu_ps(ys[m] + n, mask, v);
      }
    }
  }
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
// 16 registers of 8 lanes: each panel two of them a row, at most four rows a pass.
struct Avx2Tiles {
  static constexpr int panels_for(int rows) { return rows <= 1 ? 4 : rows <= 2 ? 2 : 1; }
  template <typename W, int MR, int P>
  static void tile(const float* xt, const W* wp, int64_t K, float* const* ys, int64_t n0, int64_t N,
                   bool accumulate) {
    const int64_t stride = panel_cols<W>(K) * kPanelRows;  // elements from one panel to the next
    // Each panel's line as two 8-lane halves (rows 0-7 and 8-15 of the panel), x's rows at most
    // four a pass so that the accumulators stay in the 16 registers; each output is the same
    // chain of FMAs over k as above, so the same bits.
    auto rows_pass = [&](auto rows_const, int m0) {
      constexpr int G = decltype(rows_const)::value;
      __m256 acc[P][G][2];
      for (int p = 0; p < P; ++p)
        for (int m = 0; m < G; ++m) acc[p][m][0] = acc[p][m][1] = _mm256_setzero_ps();
      // One column of panel p (its two halves w) times x's rows xs[0 … G).
      auto madd = [&](int p, const float* xs, const __m256 (&w)[2]) {
        for (int m = 0; m < G; ++m) {
          const __m256 xv = _mm256_set1_ps(xs[m]);
          acc[p][m][0] = _mm256_fmadd_ps(xv, w[0], acc[p][m][0]);
          acc[p][m][1] = _mm256_fmadd_ps(xv, w[1], acc[p][m][1]);
        }
      };
      if constexpr (sizeof(W) == 2) {
        const __m256i high = _mm256_set1_epi32(int(0xffff0000u));
        for (int64_t k = 0; k < K; k += 2) {
          const float* xk = xt + k * MR + m0;
          const bool pair = k + 1 < K;
          for (int p = 0; p < P; ++p) {
            const W* at = wp + p * stride + k * kPanelRows;
            _mm_prefetch(reinterpret_cast<const char*>(at + kPrefetchAhead * kPanelRows), _MM_HINT_T0);
            const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
            const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at) + 1);
            const __m256 w0[2] = {_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)),
                                  _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16))};
            madd(p, xk, w0);
            if (pair) {
              const __m256 w1[2] = {_mm256_castsi256_ps(_mm256_and_si256(lo, high)),
                                    _mm256_castsi256_ps(_mm256_and_si256(hi, high))};
              madd(p, xk + MR, w1);
            }
          }
        }
      } else {
        for (int64_t k = 0; k < K; ++k) {
          const float* xk = xt + k * MR + m0;
          for (int p = 0; p < P; ++p) {
            const W* at = wp + p * stride + k * kPanelRows;
            _mm_prefetch(reinterpret_cast<const char*>(at + kPrefetchAhead * kPanelRows), _MM_HINT_T0);
            const __m256 wv[2] = {_mm256_loadu_ps(reinterpret_cast<const float*>(at)),
                                  _mm256_loadu_ps(reinterpret_cast<const float*>(at) + 8)};
            madd(p, xk, wv);
          }
        }
      }
      for (int p = 0; p < P; ++p) {
        const int64_t n = n0 + p * kPanelRows;
        if (n >= N) break;
        const int64_t valid = std::min<int64_t>(kPanelRows, N - n);
        for (int m = 0; m < G; ++m) {
          alignas(32) float v[kPanelRows];
          _mm256_store_ps(v, acc[p][m][0]);
          _mm256_store_ps(v + 8, acc[p][m][1]);
          float* y = ys[m0 + m] + n;
          for (int64_t i = 0; i < valid; ++i) y[i] = accumulate ? v[i] + y[i] : v[i];
        }
      }
    };
    constexpr int kRowsAPass = 4;
    for (int m0 = 0; m0 + kRowsAPass <= MR; m0 += kRowsAPass) rows_pass(std::integral_constant<int, kRowsAPass>{}, m0);
    if constexpr (MR % kRowsAPass != 0)
      rows_pass(std::integral_constant<int, MR % kRowsAPass>{}, MR - MR % kRowsAPass);
  }
};
#endif


template <typename W>
using TileFn = void (*)(const float*, const W*, int64_t, float* const*, int64_t, int64_t, bool);

template <typename W, typename Tiles, int... Rs>
constexpr auto make_tile_table(std::integer_sequence<int, Rs...>) {
  struct Table {
    TileFn<W> wide[sizeof...(Rs)], single[sizeof...(Rs)];
  };
  return Table{{&Tiles::template tile<W, Rs + 1, Tiles::panels_for(Rs + 1)>...},
               {&Tiles::template tile<W, Rs + 1, 1>...}};
}
template <typename W, typename Tiles>
constexpr auto kTiles = make_tile_table<W, Tiles>(std::make_integer_sequence<int, kPanelRows>{});

}  // namespace

std::vector<PanelKernel> built_panel_kernels() {
  std::vector<PanelKernel> k{PanelKernel::Scalar};
#if defined(__AVX2__) && defined(__FMA__)
  k.push_back(PanelKernel::Avx2);
#endif
#ifdef __AVX512F__
  k.push_back(PanelKernel::Avx512);
#endif
  return k;
}

const char* panel_kernel_name(PanelKernel k) {
  switch (k) {
    case PanelKernel::Avx512: return "AVX-512";
    case PanelKernel::Avx2: return "AVX2";
    default: return "scalar";
  }
}

namespace {
PanelKernel& chosen_panel_kernel() {
  static PanelKernel k = [] {
    const std::vector<PanelKernel> built = built_panel_kernels();
    const char* e = std::getenv("DFLASH_CPU_AVX512");
    if (e && std::string(e) == "0" && built.back() == PanelKernel::Avx512) return PanelKernel::Avx2;
    return built.back();
  }();
  return k;
}
}  // namespace

PanelKernel panel_kernel() { return chosen_panel_kernel(); }

void set_panel_kernel(PanelKernel k) {
  const std::vector<PanelKernel> built = built_panel_kernels();
  if (std::find(built.begin(), built.end(), k) == built.end())
    throw Error(std::string("the ") + panel_kernel_name(k) + " panel kernel is not built on this machine");
  chosen_panel_kernel() = k;
}

int64_t packed_bf16_bytes(int64_t rows, int64_t cols) {
  return std::max<int64_t>(1, panel_count(rows)) * kPanelRows * bf16_panel_cols(cols) * int64_t(sizeof(uint16_t));
}

void pack_bf16_panels(const std::vector<const TensorInfo*>& parts, int64_t cols, uint16_t* dst) {
  // Byte pointers: a checkpoint's tensor data need not be 2-byte aligned.
  std::vector<const uint8_t*> rows;
  for (const auto* p : parts) {
    const int64_t r = p->shape.size() == 2 ? p->shape[0] : 1;
    for (int64_t i = 0; i < r; ++i) rows.push_back(p->data + i * cols * 2);
  }
  const int64_t N = static_cast<int64_t>(rows.size()), panels = panel_count(N);
#pragma omp parallel for schedule(static) if (N * cols > (1 << 20))
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t held = bf16_panel_cols(cols);
    uint16_t* out = dst + p * held * kPanelRows;
    for (int64_t k = 0; k < held; ++k)
      for (int64_t i = 0; i < kPanelRows; ++i) {
        const int64_t n = p * kPanelRows + i;
        uint16_t v = 0;
        if (n < N && k < cols) std::memcpy(&v, rows[n] + 2 * k, 2);
        out[panel_offset<uint16_t>(k, i)] = v;
      }
  }
}

int64_t packed_f32_bytes(int64_t rows, int64_t cols) {
  return std::max<int64_t>(1, panel_count(rows)) * kPanelRows * cols * int64_t(sizeof(float));
}

void pack_f32_panels(const std::vector<const TensorInfo*>& parts, int64_t cols, float* dst) {
  std::vector<std::pair<const TensorInfo*, int64_t>> rows;  // (tensor, row in it)
  for (const auto* p : parts) {
    const int64_t r = p->shape.size() == 2 ? p->shape[0] : 1;
    for (int64_t i = 0; i < r; ++i) rows.emplace_back(p, i);
  }
  const int64_t N = static_cast<int64_t>(rows.size()), panels = panel_count(N);
#pragma omp parallel for schedule(static) if (N * cols > (1 << 20))
  for (int64_t p = 0; p < panels; ++p) {
    std::vector<float> row(static_cast<size_t>(cols));
    float* out = dst + p * cols * kPanelRows;
    for (int64_t i = 0; i < kPanelRows; ++i) {
      const int64_t n = p * kPanelRows + i;
      if (n < N) {
        const TensorInfo* t = rows[size_t(n)].first;
        convert_to_f32(t->dtype, t->data + size_t(rows[size_t(n)].second * cols) * dtype_size(t->dtype), row.data(),
                       size_t(cols));
      } else {
        std::fill(row.begin(), row.end(), 0.0f);
      }
      for (int64_t k = 0; k < cols; ++k) out[k * kPanelRows + i] = row[size_t(k)];
    }
  }
}

void packed_row_to_f32(const Tensor& w, int64_t n, float* dst) {
  if (w.dtype == DType::F32) {
    const float* base = panel_base<float>(w, n / kPanelRows) + n % kPanelRows;
    for (int64_t k = 0; k < w.cols; ++k) dst[k] = base[k * kPanelRows];
    return;
  }
  const uint16_t* base = panel_base<uint16_t>(w, n / kPanelRows);
  for (int64_t k = 0; k < w.cols; ++k) dst[k] = bf16_to_f32(base[panel_offset<uint16_t>(k, n % kPanelRows)]);
}

void unpack_rows_to_f32(const Tensor& w, int64_t n0, int64_t count, float* dst) {
#pragma omp parallel for schedule(static) if (count * w.cols > (1 << 16))
  for (int64_t r = 0; r < count; ++r) packed_row_to_f32(w, n0 + r, dst + r * w.cols);
}

namespace {

template <typename W, typename Tiles>
void run_panels(const float* const* xt, const Tensor& w, float* const* ys, int64_t M, bool accumulate) {
  const int64_t K = w.cols, N = w.rows, panels = panel_count(N);
  // One tile width for all row chunks, so the parallel loop's unit is the same for each.
  const int P = Tiles::panels_for(static_cast<int>(std::min<int64_t>(M, kPanelRows)));
  const int64_t groups = (panels + P - 1) / P;
#pragma omp parallel for schedule(static) if (N * K > (1 << 16))
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t p0 = g * P, here = std::min<int64_t>(P, panels - p0);
    for (int64_t m0 = 0, c = 0; m0 < M; m0 += kPanelRows, ++c) {
      const int rows = static_cast<int>(std::min<int64_t>(kPanelRows, M - m0));
      if (here == Tiles::panels_for(rows)) {
        kTiles<W, Tiles>.wide[rows - 1](xt[c], panel_base<W>(w, p0), K, ys + m0, p0 * kPanelRows, N, accumulate);
      } else {
        for (int64_t p = p0; p < p0 + here; ++p)
          kTiles<W, Tiles>.single[rows - 1](xt[c], panel_base<W>(w, p), K, ys + m0, p * kPanelRows, N, accumulate);
      }
    }
  }
}

}  // namespace

void packed_matmul(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) {
  const int64_t M = x.rows, K = w.cols, N = w.rows;
  if (M > kPackedMaxRows) throw Error("cpu packed matmul: " + std::to_string(M) + " rows");
  if (M == 0 || N == 0) return;
  float* ys[kPackedMaxRows];
  for (int64_t m = 0; m < M; ++m) ys[m] = y.ptr<float>() + m * y.ld;
  // x interleaved by k, one block per chunk of up to 16 rows (a single row is its own).
  thread_local std::vector<float> interleaved;
  const float* xt[(kPackedMaxRows + kPanelRows - 1) / kPanelRows];
  if (M == 1) {
    xt[0] = x.ptr<float>();
  } else {
    interleaved.resize(size_t(M * K));
    for (int64_t m0 = 0, c = 0; m0 < M; m0 += kPanelRows, ++c) {
      const int64_t rows = std::min<int64_t>(kPanelRows, M - m0);
      float* dst = interleaved.data() + m0 * K;
      for (int64_t m = 0; m < rows; ++m) {
        const float* src = x.ptr<float>() + (m0 + m) * x.ld;
        for (int64_t k = 0; k < K; ++k) dst[k * rows + m] = src[k];
      }
      xt[c] = dst;
    }
  }
  auto run = [&](auto tiles) {
    using Tiles = decltype(tiles);
    if (w.dtype == DType::F32) run_panels<float, Tiles>(xt, w, ys, M, accumulate);
    else run_panels<uint16_t, Tiles>(xt, w, ys, M, accumulate);
  };
  switch (panel_kernel()) {
#ifdef __AVX512F__
    case PanelKernel::Avx512: return run(Avx512Tiles{});
#endif
#if defined(__AVX2__) && defined(__FMA__)
    case PanelKernel::Avx2: return run(Avx2Tiles{});
#endif
    default: return run(ScalarTiles{});
  }
}

}  // namespace dflash
