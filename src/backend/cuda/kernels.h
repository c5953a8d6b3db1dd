#pragma once
// Launchers for the backend's own kernels, one .cu file per concern. Each takes raw device
// pointers, row strides in elements and the stream; shapes were checked by the caller
// (cuda_backend.cc), which owns the Tensor-level contract.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_common.h"

namespace dflash {
struct PenaltyEntry;  // backend/backend.h
}  // namespace dflash

namespace dflash::cuda {

// The deferred RMSNorm between two skinny products (Backend::NormedRows). An emitting product
// (partial_out set; y the f32 residual, accumulated) also stores h = bf16(norm_w ⊙ y) and, per
// row, one partial Σ y² per block over the block's columns (skinny_norm_parts(N, K) of them,
// at partial_out[m · ld_partial + block]). A consuming product (partial_in set) multiplies each
// row's sums by rsqrt(Σ partials / K + eps), the partials added in a fixed order, before its
// epilogue rounds them: so rms_norm(y) · wᵀ costs no launch of its own, and each number still
// depends only on its own row (batch invariance below).
struct SkinnyNorm {
  const float* norm_w = nullptr;    // emit: the norm's weight, f32 [N]
  __nv_bfloat16* h = nullptr;       // emit: [M, N]
  int64_t ldh = 0;
  float* partial_out = nullptr;     // emit
  __nv_bfloat16* y_copy = nullptr;  // emit, optional: bf16(y) [M, N] too (a drafter's feature rows)
  int64_t ld_y_copy = 0;
  const float* partial_in = nullptr;  // consume
  int64_t ld_partial = 0;           // either side
  int parts = 0;                    // consume: partials per row
  float eps = 0.f;                  // consume
};

// y[m, n] (+)= Σ_k x[m, k] · w[n, k], bf16 x and w, f32 accumulation, M ≤ kSkinnyMaxRows.
// Every output is reduced in the same order whatever M is, so a row computed alone (plain
// decoding) and inside a block (speculative verification) is bit-identical: that is what
// makes greedy speculative output equal plain output on this backend.
// w_uploaded: w is a weight from upload_weight, which no kernel writes, so the kernel may start
// reading it before the kernel ahead of it in the stream has finished (launch.cuh).
// norm (only where skinny_mma_applies): emit or consume a deferred norm, see SkinnyNorm.
constexpr int kSkinnyMaxRows = 32;
// w_tiled: w's pre-tiled copy (skinny_tile_weight), read instead of w where the tensor-core
// kernel takes two n8 tiles a warp; the same bits.
void skinny_matmul(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy, Elem y_elem,
                   int M, int N, int K, bool accumulate, bool w_uploaded, cudaStream_t s,
                   const SkinnyNorm* norm = nullptr, const void* w_tiled = nullptr);
// Whether the tensor-core kernel takes this product (judged from pointers, strides and K).
bool skinny_mma_applies(const void* x, int64_t ldx, const void* w, int64_t ldw, int K);
// Partial sums per row an emitting product of a [N, K] weight writes (its block count).
int skinny_norm_parts(int N, int K);

// ids[m] = the argmax over n of x[m] · w[n]ᵀ (a consumed deferred norm, as skinny_matmul with
// `norm`), chosen in the product's own kernel instead of by argmax_rows over stored logits:
// the same values, the same rule (ties to the lowest n, NaN never chosen, 0 for a row of
// nothing else), so the same ids. y (f32 [M, N], may be null) receives the logits as well.
// Returns false, having queued nothing, where the fused kernel does not apply (then run
// skinny_matmul and argmax_rows; skinny_argmax_applies asks first). scratch:
// skinny_argmax_scratch_bytes(M).
bool skinny_argmax_applies(const void* x, int64_t ldx, const void* w, int64_t ldw, int M, int N, int K);
size_t skinny_argmax_scratch_bytes(int M);
bool skinny_matmul_argmax(const void* x, int64_t ldx, const void* w, int64_t ldw, float* y, int64_t ldy, int M, int N,
                          int K, bool w_uploaded, const SkinnyNorm& norm, int32_t* ids, int64_t ld_ids, void* scratch,
                          cudaStream_t s);

// y[m, n] = silu(g)·u with g = bf16(x[m]·w[n]ᵀ), u = bf16(x[m]·w[N/2 + n]ᵀ) for w = [gate; up]
// [N, K] and bf16 y [M, N/2]: matmul then silu_mul in one launch, the same bits. Only where
// skinny_silu_pair_supported() (judged from pointers, strides, N and K, never M). norm: a
// consumed deferred norm (g and u are scaled before rounding).
bool skinny_silu_pair_supported(const void* x, int64_t ldx, const void* w, int64_t ldw, int N, int K);
void skinny_matmul_silu_mul(const void* x, int64_t ldx, const void* w, int64_t ldw, void* y, int64_t ldy, int M,
                            int N, int K, bool w_uploaded, cudaStream_t s, const SkinnyNorm* norm = nullptr,
                            const void* w_tiled = nullptr);

// A weight's copy laid out for the tensor-core kernel (DFLASH_CUDA_TILED_WEIGHTS=1, measuring):
// for each n8 tile of rows and each 32-column chunk, the 512 bytes a warp loads together, in
// lane order. bf16 [rows, cols] with row stride ld; only where skinny_tiles().
bool skinny_tiles(int64_t rows, int64_t cols, int64_t ld);
size_t skinny_tiled_bytes(int64_t rows, int64_t cols);
void skinny_tile_weight(const void* w, int64_t rows, int64_t cols, int64_t ld, void* tiled, cudaStream_t s);

// The first deferred norm of a forward pass (no product before it): h = bf16(norm_w ⊙ x) and
// one partial Σ x² per row (ld_partial = 1), for f32 x [rows, cols] with 16-byte-aligned rows
// and cols % 4 == 0.
void norm_emit(const float* x, int64_t ldx, const float* norm_w, __nv_bfloat16* h, int64_t ldh, float* partial,
               int64_t rows, int64_t cols, cudaStream_t s);
// embed (f32 x [rows, cols] ← table rows ids) and then norm_emit on x, in one launch: the same
// values and sums. Only where embed_norm_emit_applies (the table's rows aligned as x's must be).
bool embed_norm_emit_applies(const void* table, int64_t ld_table, Elem table_elem, const float* x, int64_t ldx,
                             const float* norm_w, const __nv_bfloat16* h, int64_t ldh, int64_t cols);
void embed_norm_emit(const int32_t* ids, const void* table, int64_t ld_table, Elem table_elem, float* x, int64_t ldx,
                     const float* norm_w, __nv_bfloat16* h, int64_t ldh, float* partial, int64_t rows, int64_t cols,
                     cudaStream_t s);

// Each `group` consecutive elements of a row: y = w ⊙ x / rms(x); in place allowed.
void rms_norm(const void* x, int64_t ldx, Elem x_elem, const void* w, Elem w_elem, void* y, int64_t ldy,
              Elem y_elem, int64_t rows, int64_t cols, int64_t group, float eps, cudaStream_t s);

// Rotate-half RoPE in place on bf16 x [rows, heads·head_dim]; position of row r is
// positions[r] when `positions` is non-null, else pos0 + r. cos/sin: [table rows, head_dim/2].
void rope(void* x, int64_t ldx, int64_t rows, int64_t heads, int64_t head_dim, const int32_t* positions,
          int64_t pos0, const float* cos, const float* sin, cudaStream_t s);

// Attention of bf16 q [T, hq·D] over k/v [kv_len, hkv·D] (GQA), out [T, hq·D]; causal: query t
// sees keys 0 … q_pos0 + t. Up to kAttentionSplitMaxRows rows (decode, verification, drafting
// blocks) take the split-KV path, whose result for a row depends only on the row's query, its
// visible key count and the keys — never on T or kv_len beyond that — so a row verified in a
// block equals the same row decoded alone, bit for bit. That path needs `scratch` of
// attention_scratch_bytes() (f32 partial results; 0 means none, and null is then fine), which a
// second launch merges. Larger T (prefill, attention_prefill.cu) takes a flash-attention kernel
// on the tensor cores (head sizes 16, 32, 64, 96, 128, 256), else a one-block-per-(row, head)
// kernel.
constexpr int64_t kAttentionSplitMaxRows = 32;
size_t attention_scratch_bytes(int64_t T, int64_t hq, int64_t head_dim, int64_t kv_len);
void attention(const void* q, int64_t ldq, const void* k, int64_t ldk, const void* v, int64_t ldv, void* out,
               int64_t ldo, int64_t T, int64_t hq, int64_t hkv, int64_t head_dim, int64_t kv_len, int64_t q_pos0,
               bool causal, void* scratch, cudaStream_t s);

void silu_mul(const void* gate_up, int64_t ld_gu, Elem gu_elem, void* out, int64_t ldo, Elem out_elem, int64_t rows,
              int64_t inter, cudaStream_t s);
void embed(const int32_t* ids, int64_t n, const void* table, int64_t ld_table, Elem table_elem, int64_t cols,
           void* out, int64_t ldo, Elem out_elem, cudaStream_t s);
// dst = src (converting between f32 and bf16 when the element types differ).
void copy_convert(const void* src, int64_t lds, Elem src_elem, void* dst, int64_t ldd, Elem dst_elem, int64_t rows,
                  int64_t cols, cudaStream_t s);
void add(const void* x, int64_t ldx, Elem x_elem, void* y, int64_t ldy, Elem y_elem, int64_t rows, int64_t cols,
         cudaStream_t s);
// Backend::top_k_rows on the device (candidates.cu), 1 ≤ k: per row, out holds [count,
// ids[cap], scaled[cap] as f32 bits]; survivors past cap are counted, not stored. Needs
// `scratch` of top_k_scratch_bytes() (0 for short rows) for the slices' survivors.
size_t top_k_scratch_bytes(int64_t rows, int64_t n, int k, int cap);
void top_k_rows(const float* x, int64_t ldx, int64_t rows, int64_t n, int k, float inv_t, int cap, int32_t* out,
                void* scratch, cudaStream_t s);
// Backend::top_p_rows likewise: per row [count, row mass as f32 bits, ids[cap], scaled[cap]];
// `scratch` of top_p_scratch_bytes() (0 for short rows) for the slices' partial results.
size_t top_p_scratch_bytes(int64_t rows, int64_t n);
void top_p_rows(const float* x, int64_t ldx, int64_t rows, int64_t n, float inv_t, float top_p, int cap, int32_t* out,
                void* scratch, cudaStream_t s);
// Backend::row_laws, scaled_at, draw_from_rows and draw_from_excess on the device (row_law.cu):
// row_laws writes {max, mass} as two doubles a row; `at` holds (row, id) pairs;
// draw_from_rows writes rows 0 … rows − 1's laws as row_laws does, then draws each with u[r]
// (a device array) and writes ids[r] and the scaled logit there, scaled[r]; p and q of the
// excess point at their row; each draw writes id −1 where there is no weight. The laws and
// draws need `scratch` of row_law_scratch_bytes() for their per-slice partial results.
// A law's cut (RowLaw::cut, cut_id; {−inf, 0} admits every token).
struct LawCut {
  float cut;
  int32_t cut_id;
};
size_t row_law_scratch_bytes(int64_t rows, int64_t n);
void row_laws(const float* x, int64_t ldx, int64_t rows, int64_t n, float inv_t, double* out, void* scratch,
              cudaStream_t s);
void scaled_at(const float* x, int64_t ldx, float inv_t, const int64_t* at, int count, float* out, cudaStream_t s);
// With cuts (a device array, a row each) the laws are given (the caller's {max, mass}) and the
// draw admits only each cut's tokens; without, as above.
void draw_from_rows(const float* x, int64_t ldx, int64_t rows, int64_t n, float inv_t, const double* u, double* laws,
                    const LawCut* cuts, int32_t* ids, float* scaled, void* scratch, cudaStream_t s);
void draw_from_excess(const float* p, const float* q, int64_t n, float inv_t, float p_max, double p_mass, LawCut p_cut,
                      float q_max, double q_mass, LawCut q_cut, double u, int32_t* out, void* scratch, cudaStream_t s);
// Backend::top_p_laws: laws[r] = {max, kept mass} as row_laws writes them, cuts[r] the cut;
// `scratch` of top_p_law_scratch_bytes().
size_t top_p_law_scratch_bytes(int64_t rows, int64_t n);
void top_p_laws(const float* x, int64_t ldx, int64_t rows, int64_t n, float inv_t, float top_p, float min_p,
                double* laws, LawCut* cuts, void* scratch, cudaStream_t s);
// Backend::apply_penalties (penalties.cu): row r of x penalised in place by every_row's entries,
// those of own[row_first[r] … row_first[r + 1]) taking their tokens' place (device arrays,
// PenaltyTokens' layout).
void apply_penalties(float* x, int64_t ldx, int64_t rows, const PenaltyEntry* every_row, int n_every,
                     const PenaltyEntry* own, const int32_t* row_first, float repetition, cudaStream_t s);
// out[r] = the first index of the largest value of f32 row r (NaNs ignored; 0 for a row of
// only -inf / NaN). Needs `scratch` of argmax_scratch_bytes() for the per-slice partial results.
size_t argmax_scratch_bytes(int64_t rows, int64_t cols);
void argmax_rows(const float* x, int64_t ldx, int64_t rows, int64_t cols, int32_t* out, void* scratch,
                 cudaStream_t s);
// Backend::qk_norm_rope_store on bf16 q [rows, hq·D] (in place; hq may be 0), k and v
// [rows, hkv·D] into k_dst and v_dst; f32 norm weights [D]; positions as in rope().
void qk_norm_rope_store(void* q, int64_t ldq, int64_t hq, const void* k, int64_t ldk, const void* v, int64_t ldv,
                        int64_t hkv, const float* q_norm, const float* k_norm, float eps, int64_t rows,
                        int64_t head_dim, const int32_t* positions, int64_t pos0, const float* cos, const float* sin,
                        void* k_dst, int64_t ldkd, void* v_dst, int64_t ldvd, cudaStream_t s);
// Backend::kv_norm_rope_store: qk_norm_rope_store without q for n_layers ≤ kMaxKvLayers layers'
// rows at the same positions, in one launch (head_dim 64, 128 or 256: kv_norm_rope_store_applies).
constexpr int kMaxKvLayers = 8;
struct KvLayerRows {
  const void* k;
  const void* v;
  const float* k_norm;
  void* k_dst;
  void* v_dst;
  int64_t ldk, ldv, ldkd, ldvd;
};
bool kv_norm_rope_store_applies(int64_t layers, int64_t head_dim);
void kv_norm_rope_store(const KvLayerRows* layers, int64_t n_layers, int64_t hkv, float eps, int64_t rows,
                        int64_t head_dim, const int32_t* positions, int64_t pos0, const float* cos, const float* sin,
                        cudaStream_t s);

}  // namespace dflash::cuda
