// The CPU backend's batch invariance: a row computed alone (plain decoding) and the same row
// inside a block (speculative verification) must give the same bits. Greedy speculative output
// equals plain output only because of this; the end-to-end tests could miss a violation that
// happens not to flip an argmax.
#include <cmath>
#include <cstring>
#include <random>

#include "backend/backend.h"
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

TEST(CpuBatchInvariance, PackedMatmulRowAloneEqualsRowInBlock) {
  auto b = make_cpu_backend();
  for (auto [M, K, N, dtype] : {std::tuple{16, 384, 1152, DType::BF16}, {32, 1152, 384, DType::BF16},
                                {7, 100, 37, DType::BF16}, {20, 64, 4160, DType::BF16}, {16, 96, 200, DType::F32},
                                {32, 64, 33, DType::F32}}) {
    const auto wv = random_values(size_t(N) * K, 1, 0.05f);
    std::vector<uint16_t> wbits(wv.size());
    for (size_t i = 0; i < wv.size(); ++i) wbits[i] = f32_to_bf16(wv[i]);
    TensorInfo info;
    info.name = "w";
    info.dtype = dtype;
    info.shape = {N, K};
    info.data = dtype == DType::BF16 ? reinterpret_cast<const uint8_t*>(wbits.data())
                                     : reinterpret_cast<const uint8_t*>(wv.data());
    info.nbytes = wv.size() * dtype_size(dtype);
    Tensor w = b->upload_weight({&info});
    ASSERT_TRUE(w.packed);
    const auto xv = random_values(size_t(M) * K, 2);
    Tensor x = b->upload(xv.data(), M, K), y = b->alloc(M, N, DType::F32);
    b->matmul(x, w, y);
    const auto block = fetch(*b, y);
    for (int m = 0; m < M; ++m) {
      Tensor xr = b->upload(xv.data() + size_t(m) * K, 1, K), yr = b->alloc(1, N, DType::F32);
      b->matmul(xr, w, yr);
      const auto alone = fetch(*b, yr);
      ASSERT_EQ(0, std::memcmp(alone.data(), block.data() + size_t(m) * N, N * sizeof(float)))
          << "row " << m << " of " << M << "x" << K << "x" << N << " " << dtype_name(dtype);
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
