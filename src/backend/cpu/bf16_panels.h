#pragma once
// bf16 weights on the CPU, stored as panels of 16 rows: rows n0 … n0+15 of w [N, K] are
// interleaved so that for each pair of columns (k, k+1) the 32 values w[n0 … n0+15, k … k+1]
// are one 64-byte line, each row's two values side by side. A product then widens the line
// into two 16-lane vectors (columns k and k+1) and multiplies each by a broadcast x[m, k] for
// every row m, so each output lane is one (m, n) pair and no horizontal sums are needed (the
// row-major layout needed a 16-lane reduction per output, which cost as much as the products
// at the few rows of a verification step). The same line is a row of an AMX B tile (pairs of
// columns for 16 outputs), so 32 columns of a panel are one 1 KB tile (amx_panels.h); a panel
// holds K rounded up to 32 columns, the padding zero.
//
// Every output y[m, n] is summed over k in ascending order in one f32 lane, whatever the
// number of rows and however rows and panels are tiled: a row computed alone (plain decoding)
// and inside a block (verification) gives the same bits. f32 panels keep one column a line
// (16 floats). Where the CPU has AMX, bf16 panels are multiplied on it instead (amx_panels.h):
// a different order of sums, chosen once per process, and as independent of the rows.
#include <cstdint>
#include <vector>

#include "backend/tensor.h"
#include "io/safetensors.h"

namespace dflash {

constexpr int64_t kPanelRows = 16;
// Columns a bf16 panel holds: K rounded up to whole 32-column AMX tiles.
constexpr int64_t kPanelColumnBlock = 32;
inline int64_t bf16_panel_cols(int64_t cols) { return (cols + kPanelColumnBlock - 1) / kPanelColumnBlock * kPanelColumnBlock; }

// Bytes a packed [rows, cols] weight takes (rows rounded up to whole panels, zero-filled).
int64_t packed_bf16_bytes(int64_t rows, int64_t cols);
// Packs the bf16 checkpoint tensors `parts` (concatenated along rows, each [r_i, cols]) into
// `dst` of packed_bf16_bytes(Σ r_i, cols).
void pack_bf16_panels(const std::vector<const TensorInfo*>& parts, int64_t cols, uint16_t* dst);
// f32 weights (f32 or f16 checkpoints, widened) in the same panels: the same kernel and the same
// per-row order, so f32 checkpoints are batch invariant too.
int64_t packed_f32_bytes(int64_t rows, int64_t cols);
void pack_f32_panels(const std::vector<const TensorInfo*>& parts, int64_t cols, float* dst);
// Row n of a packed weight (bf16 or f32), as f32.
void packed_row_to_f32(const Tensor& w, int64_t n, float* dst);

// The vector kernels packed_matmul can use: each built where the build targets its
// instructions (-march=native: an AVX-512 machine builds AVX-512, AVX2 and scalar), all giving
// the same bits. The process uses the widest built, or AVX2 where DFLASH_CPU_AVX512=0; decided
// once, at the first product.
enum class PanelKernel { Scalar, Avx2, Avx512 };
PanelKernel panel_kernel();
std::vector<PanelKernel> built_panel_kernels();
const char* panel_kernel_name(PanelKernel k);
// Tests and measurements only (a kernel not built is refused), as set_amx_panels: the engine
// never switches, plain and speculative decoding share one arithmetic.
void set_panel_kernel(PanelKernel k);

// Up to this many rows of x go through packed_matmul (one pass over the weights); more rows
// (prefill) widen bands of the weight and use BLAS.
constexpr int kPackedMaxRows = 32;
// y[m, n] (+)= Σ_k x[m, k] · w[n, k]; x and y f32, w packed (bf16 or f32); x.rows ≤ kPackedMaxRows.
void packed_matmul(const Tensor& x, const Tensor& w, Tensor& y, bool accumulate);
// Rows n0 … n0+count−1 of a packed weight widened to f32 row-major [count, K]; n0 is a
// multiple of kPanelRows.
void unpack_rows_to_f32(const Tensor& w, int64_t n0, int64_t count, float* dst);

}  // namespace dflash
