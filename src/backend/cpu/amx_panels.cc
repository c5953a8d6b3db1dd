#include "backend/cpu/amx_panels.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define DFLASH_AMX 1
#include <immintrin.h>
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

constexpr int64_t kPrefetchBlocks = 2;  // 2 KB ahead in each panel

// Panels against the A tiles, each C tile accumulating over the panels' 32-column blocks in
// order. A tile product waits for the one before it into the same C tile, so independent C tiles
// are kept in flight: three panels at a time against one A tile (up to 8 rows of x), two
// against two (up to 16 rows), one against three or four. Tile numbers are immediates, hence
// the templates. c receives C tile t at c + 256·t (16 rows of 16 floats).
template <int R, int P>
void panels_on_tiles(const uint16_t* a, int64_t a_stride, const uint16_t* panel, int64_t panel_stride,
                     int64_t blocks, float* c) {
  static_assert((R == 1 && P <= 3) || (R == 2 && P <= 2) || (R > 2 && R <= 4 && P == 1), "8 tiles");
  const int64_t a_bytes = a_stride * int64_t(sizeof(uint16_t));
  const int64_t a_tile = 16 * a_stride, b_tile = 16 * kPanelColumnBlock;
  _tile_zero(0);
  if constexpr (R * P > 1) _tile_zero(1);
  if constexpr (R * P > 2) _tile_zero(2);
  if constexpr (R * P > 3) _tile_zero(3);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint16_t* ab = a + b * kPanelColumnBlock;
    const uint16_t* bb = panel + b * b_tile;
    // The weights stream from the last-level cache or memory, and a tile load that misses
    // stalls the tile products behind it: each panel's block kPrefetchBlocks ahead is asked for
    // now (a prefetch past the end of the weight is harmless).
    for (int q = 0; q < P; ++q)
      for (int line = 0; line < 16; ++line)
        _mm_prefetch(reinterpret_cast<const char*>(bb + q * panel_stride + kPrefetchBlocks * b_tile + line * 32),
                     _MM_HINT_T0);
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
  if (M > kPackedMaxRows || w.dtype != DType::BF16 || !w.packed)
    throw Error("cpu amx matmul: " + x.describe() + " · " + w.describe());
  if (M == 0 || N == 0) return;
  const int64_t Kp = bf16_panel_cols(K), blocks = Kp / kPanelColumnBlock;
  const int R = static_cast<int>((2 * M + 15) / 16);
  // A: row m of x's hi parts, row M + m its lo parts, zero past K and past 2M rows.
  thread_local std::vector<uint16_t> a;
  a.assign(size_t(R) * 16 * size_t(Kp), 0);
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x.ptr<float>() + m * x.ld;
    uint16_t* hi = a.data() + m * Kp;
    uint16_t* lo = a.data() + (M + m) * Kp;
    for (int64_t k = 0; k < K; ++k) {
      hi[k] = high_part(xr[k]);
      lo[k] = f32_to_bf16(xr[k] - bf16_to_f32(hi[k]));
    }
  }
  const int64_t panels = (N + kPanelRows - 1) / kPanelRows;
  const int P = R == 1 ? 3 : R == 2 ? 2 : 1;  // panels a step (panels_on_tiles)
  const int64_t steps = (panels + P - 1) / P, panel_stride = Kp * kPanelRows;
  const uint16_t* wp = w.ptr<uint16_t>();
  const uint16_t* ap = a.data();  // the calling thread's buffer: `a` names another in each worker
#pragma omp parallel if (N * K > (1 << 16))
  {
    configure_tiles();
    alignas(64) float c[4 * 16 * 16];
#pragma omp for schedule(static)
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t p0 = step * P, here = std::min<int64_t>(P, panels - p0);
      const uint16_t* panel = wp + p0 * panel_stride;
      // The last step may hold fewer panels; it runs them one at a time.
      for (int64_t q = 0; q < here; q += (here == P ? P : 1)) {
        const uint16_t* pq = panel + q * panel_stride;
        const bool whole = here == P;
        if (R == 1 && whole && P == 3) panels_on_tiles<1, 3>(ap, Kp, pq, panel_stride, blocks, c);
        else if (R == 1) panels_on_tiles<1, 1>(ap, Kp, pq, panel_stride, blocks, c);
        else if (R == 2 && whole) panels_on_tiles<2, 2>(ap, Kp, pq, panel_stride, blocks, c);
        else if (R == 2) panels_on_tiles<2, 1>(ap, Kp, pq, panel_stride, blocks, c);
        else if (R == 3) panels_on_tiles<3, 1>(ap, Kp, pq, panel_stride, blocks, c);
        else panels_on_tiles<4, 1>(ap, Kp, pq, panel_stride, blocks, c);
        const int done = whole ? P : 1;
        for (int d = 0; d < done; ++d) {
          const int64_t n0 = (p0 + q + d) * kPanelRows, cols = std::min<int64_t>(kPanelRows, N - n0);
          const float* cp = c + d * R * 256;  // panel d's C tiles: rows 16r … of tile R·d + r
          for (int64_t m = 0; m < M; ++m) {
            float* yr = y.ptr<float>() + m * y.ld + n0;
            const float* hi = cp + m * 16;
            const float* lo = cp + (M + m) * 16;
            for (int64_t j = 0; j < cols; ++j) {
              const float s = hi[j] + lo[j];
              yr[j] = accumulate ? yr[j] + s : s;
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
