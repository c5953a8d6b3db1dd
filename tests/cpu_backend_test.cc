// The CPU backend's batch invariance: a row computed alone (plain decoding) and the same row
// inside a block (speculative verification) must give the same bits. Greedy speculative output
// equals plain output only because of this; the end-to-end tests could miss a violation that
// happens not to flip an argmax.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/amx_panels.h"
#include "backend/cpu/bf16_panels.h"
#include "test_util.h"

using namespace dflash;

namespace {

std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

std::vector<float> fetch(Backend& b, const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  b.download(t, v.data());
  return v;
}

// The products' kernels this build and CPU have: each vector kernel built (scalar, AVX2 where the
// build targets it, AVX-512 where it does), and AMX where the build and the kernel allow. Each is
// checked on its own; the process's choice is restored afterwards.
struct ProductKernel {
  bool amx;
  PanelKernel panel;
  std::string name() const { return amx ? " on AMX" : std::string(" on the ") + panel_kernel_name(panel) + " kernel"; }
  void use() const {
    set_amx_panels(amx);
    set_panel_kernel(panel);
  }
};

std::vector<ProductKernel> product_kernels() {
  std::vector<ProductKernel> kernels;
  for (PanelKernel k : built_panel_kernels()) kernels.push_back({false, k});
  set_amx_panels(true);
  if (amx_panels_active()) kernels.push_back({true, panel_kernel()});
  return kernels;
}

struct RestoreProductKernel {
  bool was = amx_panels_active();
  PanelKernel panel = panel_kernel();
  ~RestoreProductKernel() {
    set_amx_panels(was);
    set_panel_kernel(panel);
  }
};

Tensor upload_matrix(Backend& b, const std::vector<float>& wv, int64_t N, int64_t K, DType dtype,
                     std::vector<uint16_t>& wbits) {
  wbits.resize(wv.size());
  for (size_t i = 0; i < wv.size(); ++i) wbits[i] = f32_to_bf16(wv[i]);
  TensorInfo info;
  info.name = "w";
  info.dtype = dtype;
  info.shape = {N, K};
  info.data = dtype == DType::BF16 ? reinterpret_cast<const uint8_t*>(wbits.data())
                                   : reinterpret_cast<const uint8_t*>(wv.data());
  info.nbytes = wv.size() * dtype_size(dtype);
  return b.upload_weight({&info});
}

// Each row of x · wᵀ computed in one call of M rows equals that row computed alone, bit for bit.
void expect_rows_alone_equal_rows_in_block(Backend& b, int M, int K, int N, DType dtype, uint32_t seed,
                                           const std::string& what) {
  const auto wv = random_values(size_t(N) * K, seed, 0.05f);
  std::vector<uint16_t> wbits;
  Tensor w = upload_matrix(b, wv, N, K, dtype, wbits);
  ASSERT_TRUE(w.packed);
  const auto xv = random_values(size_t(M) * K, seed + 1);
  Tensor x = b.upload(xv.data(), M, K), y = b.alloc(M, N, DType::F32);
  b.matmul(x, w, y);
  const auto block = fetch(b, y);
  for (int m = 0; m < M; ++m) {
    Tensor xr = b.upload(xv.data() + size_t(m) * K, 1, K), yr = b.alloc(1, N, DType::F32);
    b.matmul(xr, w, yr);
    const auto alone = fetch(b, yr);
    ASSERT_EQ(0, std::memcmp(alone.data(), block.data() + size_t(m) * N, N * sizeof(float)))
        << "row " << m << " of " << M << "x" << K << "x" << N << " " << dtype_name(dtype) << what;
  }
}

TEST(CpuBatchInvariance, PackedMatmulRowAloneEqualsRowInBlock) {
  auto b = make_cpu_backend();
  const RestoreProductKernel restore;
  for (const ProductKernel& kernel : product_kernels()) {
    kernel.use();
    // Rows 1 … 32 (AMX: one to four A tiles), K not a multiple of 32, N not of 16 or 48.
    for (auto [M, K, N, dtype] : {std::tuple{16, 384, 1152, DType::BF16}, {32, 1152, 384, DType::BF16},
                                  {7, 100, 37, DType::BF16}, {20, 64, 4160, DType::BF16}, {5, 96, 200, DType::BF16},
                                  {12, 33, 49, DType::BF16}, {16, 96, 200, DType::F32}, {32, 64, 33, DType::F32}})
      expect_rows_alone_equal_rows_in_block(*b, M, K, N, dtype, 1, kernel.name());
  }
}

// On AMX a prompt's rows (more than 32) take the same kernel 32 rows at a time, so each equals
// the row computed alone, as in decoding (through BLAS they need not).
TEST(CpuBatchInvariance, AmxPromptRowsEqualRowsAlone) {
  auto b = make_cpu_backend();
  const RestoreProductKernel restore;
  set_amx_panels(true);
  if (!amx_panels_active()) GTEST_SKIP() << "needs AMX (this CPU or kernel has none)";
  for (auto [M, K, N] : {std::tuple{70, 384, 200}, {33, 100, 37}})
    expect_rows_alone_equal_rows_in_block(*b, M, K, N, DType::BF16, 21, " on AMX");
}

// Every vector kernel built (scalar, AVX2, AVX-512) sums each output as
// one chain of f32 FMAs over k in ascending order, then adds the accumulate input: the order
// bf16_panels.h promises, so every build of it gives the same bits. Checked bit for bit against
// that chain written out with std::fma, at row counts that take each tile shape (1, 2, 3, 4 and
// more rows a pass) and K, N off the panels' multiples.
TEST(CpuProducts, VectorKernelSumsEachOutputAsOneFmaChain) {
  auto b = make_cpu_backend();
  const RestoreProductKernel restore;
  set_amx_panels(false);
  for (PanelKernel kernel : built_panel_kernels()) {
    set_panel_kernel(kernel);
    for (auto [M, K, N, dtype] : {std::tuple{1, 100, 70, DType::BF16}, {2, 64, 37, DType::BF16}, {3, 33, 50, DType::BF16},
                                  {5, 96, 20, DType::BF16}, {16, 65, 33, DType::BF16}, {32, 40, 17, DType::BF16},
                                  {1, 50, 40, DType::F32}, {7, 31, 18, DType::F32}}) {
      const auto wv = random_values(size_t(N) * K, 31, 0.05f);
      std::vector<uint16_t> wbits;
      Tensor w = upload_matrix(*b, wv, N, K, dtype, wbits);
      const auto xv = random_values(size_t(M) * K, 32);
      const auto y0 = random_values(size_t(M) * N, 33);
      Tensor x = b->upload(xv.data(), M, K), y = b->upload(y0.data(), M, N);
      b->matmul(x, w, y, /*accumulate=*/true);
      const auto got = fetch(*b, y);
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          float s = 0.f;
          for (int k = 0; k < K; ++k) {
            const float wk = dtype == DType::BF16 ? bf16_to_f32(wbits[size_t(n) * K + k]) : wv[size_t(n) * K + k];
            s = std::fma(xv[size_t(m) * K + k], wk, s);
          }
          const float want = s + y0[size_t(m) * N + n];
          ASSERT_EQ(0, std::memcmp(&want, &got[size_t(m) * N + n], sizeof(float)))
              << "y[" << m << ", " << n << "] of " << M << "x" << K << "x" << N << " " << dtype_name(dtype) << " on the "
              << panel_kernel_name(kernel) << " kernel: " << got[size_t(m) * N + n] << " against " << want;
        }
    }
  }
}

// Both kernels keep f32-compute accuracy on bf16 weights (AMX through x's hi + lo parts): every
// output within 1e-5 of the largest |y| of its row, against sums in double. A product that
// added its accumulate input wrongly, dropped the lo part (≈ 2^-9 relative) or a block of K
// would miss it.
TEST(CpuProducts, Bf16PanelsKeepF32Accuracy) {
  auto b = make_cpu_backend();
  const RestoreProductKernel restore;
  for (const ProductKernel& kernel : product_kernels()) {
    kernel.use();
    for (auto [M, K, N] : {std::tuple{1, 384, 1152}, {16, 1152, 384}, {9, 100, 37}, {32, 64, 70}, {45, 96, 50}}) {
      const auto wv = random_values(size_t(N) * K, 11, 0.05f);
      std::vector<uint16_t> wbits;
      Tensor w = upload_matrix(*b, wv, N, K, DType::BF16, wbits);
      const auto xv = random_values(size_t(M) * K, 12, 3.0f);
      const auto y0 = random_values(size_t(M) * N, 13);
      Tensor x = b->upload(xv.data(), M, K), y = b->upload(y0.data(), M, N);
      b->matmul(x, w, y, /*accumulate=*/true);
      const auto got = fetch(*b, y);
      for (int m = 0; m < M; ++m) {
        std::vector<double> want(static_cast<size_t>(N));
        double scale = 0;
        for (int n = 0; n < N; ++n) {
          double s = y0[size_t(m) * N + n];
          for (int k = 0; k < K; ++k) s += double(xv[size_t(m) * K + k]) * double(bf16_to_f32(wbits[size_t(n) * K + k]));
          want[size_t(n)] = s;
          scale = std::max(scale, std::abs(s));
        }
        for (int n = 0; n < N; ++n)
          ASSERT_NEAR(got[size_t(m) * N + n], want[size_t(n)], 1e-5 * scale)
              << "y[" << m << ", " << n << "] of " << M << "x" << K << "x" << N << kernel.name();
      }
    }
  }
}

// x values near float's limit: AMX's bf16 hi part would round to infinity; the product stays
// finite and right.
TEST(CpuProducts, HugeActivationsStayFinite) {
  auto b = make_cpu_backend();
  const RestoreProductKernel restore;
  for (const ProductKernel& kernel : product_kernels()) {
    kernel.use();
    const int64_t K = 64, N = 16;
    std::vector<float> wv(size_t(N * K), 0.f);
    for (int64_t n = 0; n < N; ++n) wv[size_t(n * K + n)] = 0.5f;  // y[n] = x[n] / 2
    std::vector<uint16_t> wbits;
    Tensor w = upload_matrix(*b, wv, N, K, DType::BF16, wbits);
    std::vector<float> xv(size_t(K), 0.f);
    for (int64_t k = 0; k < N; ++k) xv[size_t(k)] = (k % 2 ? -1.f : 1.f) * 3.4e38f;
    Tensor x = b->upload(xv.data(), 1, K), y = b->alloc(1, N, DType::F32);
    b->matmul(x, w, y);
    const auto got = fetch(*b, y);
    for (int64_t n = 0; n < N; ++n) {
      ASSERT_TRUE(std::isfinite(got[size_t(n)])) << n << kernel.name();
      EXPECT_NEAR(got[size_t(n)], xv[size_t(n)] / 2, 1e-5 * 1.7e38) << n << kernel.name();
    }
  }
}

TEST(CpuBatchInvariance, AttentionRowAloneEqualsRowInBlock) {
  auto b = make_cpu_backend();
  const int64_t hq = 6, hkv = 2, D = 64, kv_len = 300, T = 16, pos0 = kv_len - T;
  const auto kv = random_values(size_t(kv_len * hkv * D) * 2, 3);
  Tensor k = b->upload(kv.data(), kv_len, hkv * D), v = b->upload(kv.data() + kv_len * hkv * D, kv_len, hkv * D);
  const auto qv = random_values(size_t(T * hq * D), 4);
  for (AttentionMask mask : {AttentionMask::Causal, AttentionMask::None}) {
    Tensor q = b->upload(qv.data(), T, hq * D), out = b->alloc(T, hq * D, DType::F32);
    b->attention(q, k, v, kv_len, pos0, D, mask, out);
    const auto block = fetch(*b, out);
    for (int64_t t = 0; t < T; ++t) {
      // Alone, the row sees the cache only up to itself, as in a plain decoding step.
      const int64_t len = mask == AttentionMask::Causal ? pos0 + t + 1 : kv_len;
      Tensor qr = b->upload(qv.data() + t * hq * D, 1, hq * D), o = b->alloc(1, hq * D, DType::F32);
      b->attention(qr, k.slice_rows(0, len), v.slice_rows(0, len), len, pos0 + t, D, mask, o);
      const auto alone = fetch(*b, o);
      ASSERT_EQ(0, std::memcmp(alone.data(), block.data() + t * hq * D, hq * D * sizeof(float)))
          << "row " << t << (mask == AttentionMask::Causal ? " causal" : " unmasked");
    }
  }
}

}  // namespace

namespace {

Tensor bf16_weight(Backend& b, const std::vector<float>& v, std::vector<int64_t> shape, std::vector<uint16_t>& bits) {
  bits.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = f32_to_bf16(v[i]);
  TensorInfo info;
  info.name = "w";
  info.dtype = DType::BF16;
  info.shape = std::move(shape);
  info.data = reinterpret_cast<const uint8_t*>(bits.data());
  info.nbytes = bits.size() * 2;
  return b.upload_weight({&info});
}

}  // namespace

// A backend may leave a norm deferred (NormedRows); a product that cannot read that form (the
// default implementations) must recompute the norm from x, never use h as if it were final.
TEST(NormedRows, ADeferredNormIsRecomputedByTheDefaultProducts) {
  auto b = make_cpu_backend();
  const int64_t M = 3, H = 64, N = 40, I = 20;
  const float eps = 1e-6f;
  std::vector<uint16_t> nb, wb, gb;
  const auto xv = random_values(size_t(M * H), 5, 2.0f);
  Tensor x = b->upload(xv.data(), M, H);
  Tensor nw = bf16_weight(*b, random_values(size_t(H), 6), {H}, nb);
  Tensor w = bf16_weight(*b, random_values(size_t(N * H), 7, 0.1f), {N, H}, wb);
  Tensor gu = bf16_weight(*b, random_values(size_t(2 * I * H), 8, 0.1f), {2 * I, H}, gb);

  NormedRows plain;
  plain.h = b->alloc(M, H, b->activation_dtype());
  b->norm_rows(x, nw, eps, plain);
  EXPECT_FALSE(plain.deferred);
  Tensor y_ref = b->alloc(M, N, DType::F32), act_ref = b->alloc(M, I, b->activation_dtype());
  b->matmul_normed(plain, w, y_ref);
  b->matmul_silu_mul_normed(plain, gu, act_ref);

  // The same norm as a backend might leave it: h not yet final (here NaN), x and the weight kept.
  const std::vector<float> nan(size_t(M * H), std::nanf(""));
  NormedRows deferred = plain;
  deferred.h = b->upload(nan.data(), M, H);
  deferred.partial = b->upload(nan.data(), M, 1);
  deferred.deferred = true;
  Tensor y = b->alloc(M, N, DType::F32), act = b->alloc(M, I, b->activation_dtype());
  b->Backend::matmul_normed(deferred, w, y);
  b->Backend::matmul_silu_mul_normed(deferred, gu, act);
  const auto want = fetch(*b, y_ref), got = fetch(*b, y);
  ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
  const auto act_want = fetch(*b, act_ref), act_got = fetch(*b, act);
  ASSERT_EQ(0, std::memcmp(act_want.data(), act_got.data(), act_want.size() * sizeof(float)));

  // Rows sliced out of it stay rows of the same norm.
  Tensor y2 = b->alloc(2, N, DType::F32);
  b->Backend::matmul_normed(deferred.slice_rows(1, 2), w, y2);
  const auto got2 = fetch(*b, y2);
  ASSERT_EQ(0, std::memcmp(want.data() + N, got2.data(), got2.size() * sizeof(float)));
}
