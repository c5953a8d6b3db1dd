// The CPU backend's batch invariance: a row computed alone (plain decoding) and the same row
// inside a block (speculative verification) must give the same bits. Greedy speculative output
// equals plain output only because of this; the end-to-end tests could miss a violation that
// happens not to flip an argmax.
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
