#pragma once
// The logits of one forward pass, read from the backend in the form the sampler needs, in one
// transfer for all rows. Penalties come first, where the rows are (Backend::apply_penalties),
// so every form below serves requests with penalties as it serves those without:
// - greedy: each row's argmax (Backend::argmax_rows), token ids only;
// - sampling with top-k: the survivors of temperature and top-k (Backend::top_k_rows), O(k)
//   values a row instead of a vocabulary of them; a row whose ties overflow the buffer is read
//   whole;
// - sampling with top-p and no top-k: top-p's candidates and the row's mass
//   (Backend::top_p_rows), the nucleus and a few tokens more instead of the vocabulary; on a
//   GPU a row whose candidates are over the cap (a flat row's nucleus is most of the vocabulary)
//   stays where it is, as its top-p law (Backend::top_p_laws: the cut and the mass of what it
//   keeps), and is drawn from there as in the temperature-alone form; on the CPU it is read whole;
// - sampling with min-p and neither top-k nor top-p, on a GPU: every row as its law on the
//   device (min-p's cut is a value: Backend::top_p_laws), drawn from there;
// - sampling with temperature alone (no top-k, top-p or min-p) on a GPU: no candidate set is
//   smaller than the row, so the row stays where it is: draws (each with its row's max and
//   mass, Backend::draw_from_rows), laws with p(d) (Backend::row_laws) and the acceptance rule's
//   residual computed there, one trip each;
// - otherwise the whole rows.
// Every form gives the distribution token_distribution() gives the whole row. The top-k form
// gives the same tokens with the same probabilities. The top-p form sums the row's mass on the
// device in another order, so its probabilities may differ in the last bits and, rarely, a
// uniform on a boundary picks the neighbouring token. The temperature-alone form weighs tokens in
// f64 where the whole-row path rounds each probability to f32: the same law to f32 rounding,
// but draws from the same uniforms are not token-for-token those of the whole-row path (they are
// those of the same form on the CPU backend: the GPU test). A top-p law on the device finds its
// cut on weights fixed to 2^-40 of the largest, so it may keep or drop one token more than the
// whole-row path where that token's tail mass is within rounding of 1 − top_p.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "engine/sampling.h"

namespace dflash {

class DeviceRowLaw;  // a row left on the device, as a law (logit_rows.cc)

class LogitRows {
 public:
  LogitRows(Backend& b, const SamplingParams& sp, int vocab);
  // Takes the rows of `logits`, penalised first (a copy; `logits` stays as it is) where the
  // request has penalties: row r by the history h with its first min(r, h.extra_count) extra
  // tokens (penalty_tokens: a verification's rows see the drafts before them).
  void read(const Tensor& logits, const TokenHistory& h = {});
  // The token row `r` yields under the sampling parameters (a draw from rng when sampling).
  int32_t choose(int r, Rng& rng);
  // Rows 0 … n − 1 one after another, as choose() would (sampled rows from law(r).draw), the
  // tokens going to out. When every row is left on the device (the DeviceRows form; top-p rows
  // over the cap) the n uniforms are taken first, in row order, and the device draws every row
  // in one call, bringing back each row's law with it: the same tokens as n draws, without n
  // round trips. Otherwise the laws on the host are built first, in parallel, then every row
  // drawn in order.
  void choose_rows(int32_t* out, int n, Rng& rng);
  // Row r's law will be asked for p(ids[r]), r < n: in the DeviceRows form every row's law and
  // those values are fetched now in one call (the acceptance rule's p(d) for a whole block), for
  // top-p rows left on the device their logits at ids (their laws are known already); a
  // no-op in the other forms (there the rule asks rows one by one until it rejects, and building
  // the block's laws at once cost more than the one or two it asks: H200, 8B shapes, top-p 0.9).
  void look_up(const int32_t* ids, int n);
  // The law row `r` is sampled from (speculative sampling's p and q); valid until the next read().
  const TokenLaw& law(int r);
  // The row's largest logit (benchmark-only forced acceptance).
  int32_t argmax(int r);

 private:
  enum class Form { Argmax, TopK, TopP, DeviceRows, Rows };
  const float* row(int r);  // the whole row, downloaded on first use where the form lacks it
  bool has_candidates(int r) const;  // the TopK / TopP forms' row r came as candidates
  bool on_device(int r) const;       // row r's law is a DeviceRowLaw (DeviceRows; TopP over the cap)
  // Row r's law from its candidates or its whole row (downloaded already), in the forms that
  // keep laws on the host.
  std::unique_ptr<TokenLaw> support_law(int r) const;
  void build_laws(int n);  // laws of rows 0 … n − 1 at once
  const DeviceRowLaw& device_law(int r);  // law(r) where on_device(r)

  Backend& backend_;
  SamplingParams sp_;  // the warpers: read() applies the penalties, and sp_ has none
  int vocab_;
  float inv_t_;  // 1 / temperature, as the candidate forms scale logits
  std::optional<PenaltyHistory> penalty_history_;  // the request's penalties, when it has some
  Form form_;
  Tensor logits_;
  std::vector<int32_t> argmax_;
  std::vector<CandidateRow> candidates_;  // the TopK and TopP forms
  bool laws_on_device_ = false;   // TopP: rows over the cap keep their laws where they are
  bool every_row_a_law_ = false;  // TopP: every row does (min-p alone; DFLASH_LOGIT_ROWS=device)
  std::vector<RowLaw> top_p_laws_;  // TopP, a row each, when some row is a law on the device
  std::vector<std::unique_ptr<TokenLaw>> laws_;  // built on first use, a row each
  std::vector<float> rows_;
  std::vector<int> row_read_;  // rows of rows_ that hold the whole row (all of them in the Rows form)
};

}  // namespace dflash
