#include "backend/cpu/amx_panels.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define DFLASH_AMX 1
// GCC 12's false "may be used uninitialized" reports inside its own AVX-512 headers: see
// cpu_backend.cc.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cpu/bf16_panels.h"
#include "util/dtype.h"
#include "util/error.h"

namespace dflash {

namespace {

// -1 not yet decided, 0 off, 1 on.
std::atomic<int> g_amx_state{-1};

#ifdef DFLASH_AMX
// Linux gives a process the tile registers' 8 KB of state only when it asks (arch_prctl,
// kernel 5.16 and later); a kernel that refuses leaves the AVX-512 path.
bool tile_state_granted() {
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  static const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

// The tile configuration register, palette 1.
struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Every tile 16 rows of 64 bytes: C is 16 rows × 16 f32 outputs, A 16 rows × 32 bf16 columns of
// x, B 16 column pairs × 16 outputs (a panel's 32 columns). Configuration belongs to a thread.
void configure_tiles() {
  thread_local bool configured = false;
  if (configured) return;
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
  configured = true;
}

// bf16 elements of a tile: 16 rows of 32.
constexpr int64_t kTileElements = 16 * kPanelColumnBlock;

// Panels against the A tiles, each C tile accumulating over the panels' 32-column blocks in
// order. A tile product waits for the one before it into the same C tile, so independent C tiles
// are kept in flight: three panels at a time against one A tile (up to 8 rows of x), two
// against two (up to 16 rows), one against three or four. Tile numbers are immediates, hence
// the templates. c receives C tile t at c + 256·t (16 rows of 16 floats). No software prefetch:
// asking for the blocks ahead (into L1 or L2, 1 to 32 blocks ahead, or by loads) made the
// one-row products slower, on a working set in the cache and streaming from memory alike.
template <int R, int P>
void panels_on_tiles(const uint16_t* a, const uint16_t* panel, int64_t panel_stride, int64_t blocks, float* c) {
  static_assert((R == 1 && P <= 3) || (R == 2 && P <= 2) || (R > 2 && R <= 4 && P == 1), "8 tiles");
  constexpr int64_t a_bytes = 64, a_tile = kTileElements, b_tile = kTileElements;
  _tile_zero(0);
  if constexpr (R * P > 1) _tile_zero(1);
  if constexpr (R * P > 2) _tile_zero(2);
  if constexpr (R * P > 3) _tile_zero(3);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint16_t* ab = a + b * R * a_tile;  // block b's A tiles, one after another
    const uint16_t* bb = panel + b * b_tile;
    if constexpr (R == 1) {  // C 0 … P−1, A 4, B 5 … 4+P
      _tile_loadd(4, ab, a_bytes);
      _tile_loadd(5, bb, 64);
      _tile_dpbf16ps(0, 4, 5);
      if constexpr (P > 1) {
        _tile_loadd(6, bb + panel_stride, 64);
        _tile_dpbf16ps(1, 4, 6);
      }
      if constexpr (P > 2) {
        _tile_loadd(7, bb + 2 * panel_stride, 64);
        _tile_dpbf16ps(2, 4, 7);
      }
    } else if constexpr (R == 2) {  // C (panel q, row tile r) = 2q + r, A 4 and 5, B 6 and 7
      _tile_loadd(4, ab, a_bytes);
      _tile_loadd(5, ab + a_tile, a_bytes);
      _tile_loadd(6, bb, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 5, 6);
      if constexpr (P > 1) {
        _tile_loadd(7, bb + panel_stride, 64);
        _tile_dpbf16ps(2, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
    } else {  // C r, B 4, A 5 … 7 (and 5 again)
      _tile_loadd(4, bb, 64);
      _tile_loadd(5, ab, a_bytes);
      _tile_dpbf16ps(0, 5, 4);
      _tile_loadd(6, ab + a_tile, a_bytes);
      _tile_dpbf16ps(1, 6, 4);
      _tile_loadd(7, ab + 2 * a_tile, a_bytes);
      _tile_dpbf16ps(2, 7, 4);
      if constexpr (R > 3) {
        _tile_loadd(5, ab + 3 * a_tile, a_bytes);
        _tile_dpbf16ps(3, 5, 4);
      }
    }
  }
  _tile_stored(0, c, 64);
  if constexpr (R * P > 1) _tile_stored(1, c + 256, 64);
  if constexpr (R * P > 2) _tile_stored(2, c + 512, 64);
  if constexpr (R * P > 3) _tile_stored(3, c + 768, 64);
}

// x's bf16 high part, rounded to nearest; toward zero where rounding would overflow, so that a
// finite x keeps a finite hi + lo.
inline uint16_t high_part(float v) {
  const uint16_t h = f32_to_bf16(v);
  if (std::isfinite(v) && !std::isfinite(bf16_to_f32(h))) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    return static_cast<uint16_t>(bits >> 16);
  }
  return h;
}

// 32 columns of a row of x (fewer where K ends: the rest zero) as bf16 hi and lo parts.
inline void split_block(const float* x, int64_t valid, uint16_t* hi, uint16_t* lo) {
#ifdef __AVX512BF16__
  const __mmask16 m0 = valid >= 16 ? __mmask16(0xffff) : valid <= 0 ? __mmask16(0) : __mmask16((1u << valid) - 1);
  const int64_t rest = valid - 16;
  const __mmask16 m1 = rest >= 16 ? __mmask16(0xffff) : rest <= 0 ? __mmask16(0) : __mmask16((1u << rest) - 1);
  const __m512 v0 = _mm512_maskz_loadu_ps(m0, x), v1 = _mm512_maskz_loadu_ps(m1, x + 16);
  __m512i hv = __m512i(_mm512_cvtne2ps_pbh(v1, v0));
  // An infinite hi (rare: a rounding overflow, or x infinite) is redone one value at a time,
  // where high_part keeps a finite x finite.
  const __mmask32 inf = _mm512_cmpeq_epi16_mask(_mm512_and_si512(hv, _mm512_set1_epi16(0x7fff)), _mm512_set1_epi16(0x7f80));
  if (inf) {
    alignas(64) uint16_t hb[32];
    _mm512_store_si512(hb, hv);
    for (int j = 0; j < 32; ++j)
      if (inf >> j & 1u) hb[j] = high_part(j < valid ? x[j] : 0.f);
    hv = _mm512_load_si512(hb);
  }
  // hi widened back to f32: bf16 is the top half of an f32.
  const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hv)), 16));
  const __m512 w1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hv, 1)), 16));
  _mm512_storeu_si512(hi, hv);
  _mm512_storeu_si512(lo, __m512i(_mm512_cvtne2ps_pbh(_mm512_sub_ps(v1, w1), _mm512_sub_ps(v0, w0))));
#else
  for (int j = 0; j < 32; ++j) {
    const float v = j < valid ? x[j] : 0.f;
    hi[j] = high_part(v);
    lo[j] = f32_to_bf16(v - bf16_to_f32(hi[j]));
  }
#endif
}
#endif

bool amx_available() {
#ifdef DFLASH_AMX
  return tile_state_granted();
#else
  return false;
#endif
}

}  // namespace

bool amx_panels_active() {
  int state = g_amx_state.load();
  if (state < 0) {
    const char* env = std::getenv("DFLASH_CPU_AMX");
    const bool on = amx_available() && !(env && std::strcmp(env, "0") == 0);
    g_amx_state.compare_exchange_strong(state, on ? 1 : 0);
    state = g_amx_state.load();
  }
  return state == 1;
}

void set_amx_panels(bool on) { g_amx_state.store(on && amx_available() ? 1 : 0); }

void amx_panel_matmul(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate) {
#ifdef DFLASH_AMX
  const int64_t M = x.rows, K = w.cols, N = w.rows;
  if (w.dtype != DType::BF16 || !w.packed) throw Error("cpu amx matmul: " + x.describe() + " · " + w.describe());
  if (M == 0 || N == 0) return;
  const int64_t Kp = bf16_panel_cols(K), blocks = Kp / kPanelColumnBlock;
  // Rows go in slices of up to kPackedMaxRows (a prompt's rows: several slices, each row
  // computed as it would be alone). Slice s's A: its rows' hi parts, then their lo parts, as
  // tiles in the order they are loaded (block 0's R tiles, then block 1's, …), each 16 rows of
  // 64 bytes, so that a tile load reads 1 KB in a row (rows 2304 bytes apart missed L1 on every
  // load: one-row products took twice as long). Rows past a slice's 2·rows keep what an earlier
  // call left: they only make C rows never read.
  struct Slice {
    int64_t m0, rows;
    int R;
    const uint16_t* a;
  };
  const int64_t slices = (M + kPackedMaxRows - 1) / kPackedMaxRows;
  thread_local std::vector<Slice> slice;
  slice.resize(size_t(slices));
  size_t elements = 0;
  for (int64_t i = 0; i < slices; ++i) {
    const int64_t m0 = i * kPackedMaxRows, rows = std::min<int64_t>(kPackedMaxRows, M - m0);
    slice[size_t(i)] = {m0, rows, static_cast<int>((2 * rows + 15) / 16), nullptr};
    elements += size_t(slice[size_t(i)].R) * size_t(blocks) * kTileElements;
  }
  // 64-byte aligned: a tile row across two cache lines doubles the lines a tile load reads.
  thread_local std::vector<uint16_t> a_storage;
  if (a_storage.size() < elements + 32) a_storage.resize(elements + 32, 0);
  uint16_t* a = a_storage.data() + (64 - reinterpret_cast<uintptr_t>(a_storage.data()) % 64) % 64 / 2;
  for (auto& sl : slice) {
    auto at = [&](int64_t row, int64_t k) {
      return a + ((k / kPanelColumnBlock) * sl.R + row / 16) * kTileElements + (row % 16) * kPanelColumnBlock +
             k % kPanelColumnBlock;
    };
    for (int64_t m = 0; m < sl.rows; ++m) {
      const float* xr = x.ptr<float>() + (sl.m0 + m) * x.ld;
      for (int64_t k0 = 0; k0 < Kp; k0 += kPanelColumnBlock)
        split_block(xr + k0, K - k0, at(m, k0), at(sl.rows + m, k0));
    }
    sl.a = a;
    a += size_t(sl.R) * size_t(blocks) * kTileElements;
  }
  const int64_t panels = (N + kPanelRows - 1) / kPanelRows;
  // Panels a step (panels_on_tiles): one where several slices share each panel, which then
  // stays in L1 from one slice to the next.
  const int R0 = slice[0].R;
  const int P = slices > 1 ? 1 : R0 == 1 ? 3 : R0 == 2 ? 2 : 1;
  const int64_t steps = (panels + P - 1) / P, panel_stride = Kp * kPanelRows;
  const uint16_t* wp = w.ptr<uint16_t>();
  const Slice* sp = slice.data();  // the calling thread's: `slice` names another in each worker
#pragma omp parallel if (N * K * M > (1 << 16))
  {
    configure_tiles();
    alignas(64) float c[4 * 16 * 16];
#pragma omp for schedule(static)
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t p0 = step * P, here = std::min<int64_t>(P, panels - p0);
      const bool whole = here == P;
      for (int64_t si = 0; si < slices; ++si) {
        const Slice& sl = sp[si];
        // The last step may hold fewer panels; it runs them one at a time.
        for (int64_t q = 0; q < here; q += whole ? P : 1) {
          const uint16_t* pq = wp + (p0 + q) * panel_stride;
          if (sl.R == 1 && whole && P == 3) panels_on_tiles<1, 3>(sl.a, pq, panel_stride, blocks, c);
          else if (sl.R == 1) panels_on_tiles<1, 1>(sl.a, pq, panel_stride, blocks, c);
          else if (sl.R == 2 && whole && P == 2) panels_on_tiles<2, 2>(sl.a, pq, panel_stride, blocks, c);
          else if (sl.R == 2) panels_on_tiles<2, 1>(sl.a, pq, panel_stride, blocks, c);
          else if (sl.R == 3) panels_on_tiles<3, 1>(sl.a, pq, panel_stride, blocks, c);
          else panels_on_tiles<4, 1>(sl.a, pq, panel_stride, blocks, c);
          const int done = whole ? P : 1;
          for (int d = 0; d < done; ++d) {
            const int64_t n0 = (p0 + q + d) * kPanelRows, cols = std::min<int64_t>(kPanelRows, N - n0);
            const float* cp = c + d * sl.R * 256;  // panel d's C tiles: rows 16r … of tile R·d + r
            for (int64_t m = 0; m < sl.rows; ++m) {
              float* yr = y.ptr<float>() + (sl.m0 + m) * y.ld + n0;
              const float* hi = cp + m * 16;
              const float* lo = cp + (sl.rows + m) * 16;
              for (int64_t j = 0; j < cols; ++j) {
                const float s = hi[j] + lo[j];
                yr[j] = accumulate ? yr[j] + s : s;
              }
            }
          }
        }
      }
    }
  }
#else
  (void)x, (void)w, (void)y, (void)accumulate;
  throw Error("cpu amx matmul: this build has no AMX code (it is built with -march=native on an AMX CPU)");
#endif
}

}  // namespace dflash
