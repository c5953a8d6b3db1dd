#pragma once
// bf16 panel products on AMX (Intel's tile unit, Sapphire Rapids and later), for the few rows of
// decoding, drafting and verification. On a small CPU the embedded pair's 16-row verification
// is arithmetic-bound on AVX-512 FMAs; one AMX tile product does 8192 multiply-adds.
//
// Accuracy: AMX multiplies bf16 by bf16. Each row of x is split into bf16 hi + lo (lo = x − hi,
// rounded; together they keep about 16 of f32's 24 bits), the weights are bf16 already, so
// every product is exact in f32 and the sums are f32: the result stays at f32-compute accuracy,
// not bf16 activations'.
//
// Batch invariance: the hi and lo parts of a row are rows of A tiles; a tile product computes
// each output from its own A row and the B tile alone, and the 32-column blocks of K are taken
// in order. So y[m, n] = Σ_blocks(hi) + Σ_blocks(lo) by the same instructions whether the row is
// alone or one of 32.
#include "backend/tensor.h"

namespace dflash {

// Whether bf16 panel products run on AMX in this process: the build targets AMX, the kernel
// granted the tile state, and DFLASH_CPU_AMX is not 0. Decided once, at the first call.
bool amx_panels_active();
// Tests and measurements only: switch the AMX path off or back on (on only where available).
// The engine never switches: plain and speculative decoding must share one arithmetic.
void set_amx_panels(bool on);
// y[m, n] (+)= Σ_k x[m, k] · w[n, k] on AMX; x f32 (any rows: 32 at a time), w packed bf16 panels.
void amx_panel_matmul(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate);

}  // namespace dflash
