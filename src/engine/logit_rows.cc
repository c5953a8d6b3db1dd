#include "engine/logit_rows.h"

#include <algorithm>

#include "util/error.h"

namespace dflash {
namespace {
// Rows of top-k survivors the device hands over; beyond this, sampling reads whole rows.
constexpr int kMaxDeviceTopK = 1024;
// Top-p candidates a row may bring back; a row with more (a flat distribution) is read whole.
constexpr int kMaxTopPCandidates = 2048;
}  // namespace

LogitRows::LogitRows(Backend& b, const SamplingParams& sp, int vocab) : backend_(b), sp_(sp), vocab_(vocab) {
  const bool penalties = sp.repetition_penalty != 1.0 || sp.presence_penalty != 0.0;
  if (sp.argmax_only()) form_ = Form::Argmax;
  else if (!sp.greedy() && !penalties && sp.top_k > 0 && sp.top_k <= kMaxDeviceTopK && sp.top_k < vocab)
    form_ = Form::TopK;
  else if (!sp.greedy() && !penalties && (sp.top_k == 0 || sp.top_k >= vocab) && sp.top_p < 1.0)
    form_ = Form::TopP;
  else form_ = Form::Rows;
}

void LogitRows::read(const Tensor& logits) {
  if (logits.cols != vocab_)
    throw Error("logit rows: " + logits.describe() + " for a vocabulary of " + std::to_string(vocab_));
  logits_ = logits;
  row_read_.assign(size_t(logits.rows), 0);
  switch (form_) {
    case Form::Argmax:
      argmax_ = backend_.argmax_rows(logits);
      break;
    case Form::TopK:
      candidates_ =
          backend_.top_k_rows(logits, sp_.top_k, static_cast<float>(1.0 / sp_.temperature), 4 * sp_.top_k + 64);
      break;
    case Form::TopP:
      candidates_ = backend_.top_p_rows(logits, static_cast<float>(1.0 / sp_.temperature),
                                        static_cast<float>(sp_.top_p), kMaxTopPCandidates);
      break;
    case Form::Rows:
      rows_.resize(size_t(logits.rows * logits.cols));
      backend_.download(logits, rows_.data());
      std::fill(row_read_.begin(), row_read_.end(), 1);
      break;
  }
}

const float* LogitRows::row(int r) {
  if (!row_read_[size_t(r)]) {
    rows_.resize(std::max(rows_.size(), size_t(logits_.rows * logits_.cols)));
    backend_.download(logits_.slice_rows(r, 1), rows_.data() + size_t(r) * vocab_);
    row_read_[size_t(r)] = 1;
  }
  return rows_.data() + size_t(r) * vocab_;
}

TokenDistribution LogitRows::distribution(int r, const TokenHistory& h) {
  if ((form_ == Form::TopK || form_ == Form::TopP) && !candidates_[size_t(r)].ids.empty()) {
    const CandidateRow& c = candidates_[size_t(r)];
    return distribution_of_candidates(c.ids, c.scaled, sp_, c.row_mass);
  }
  return token_distribution(row(r), vocab_, sp_, h);
}

int32_t LogitRows::choose(int r, const TokenHistory& h, Rng& rng) {
  if (form_ == Form::Argmax) return argmax_[size_t(r)];
  if (form_ == Form::TopK || form_ == Form::TopP) return sample_from(distribution(r, h), rng);
  return choose_token(row(r), vocab_, sp_, h, rng);
}

int32_t LogitRows::argmax(int r) {
  if (form_ == Form::Argmax) return argmax_[size_t(r)];
  return dflash::argmax(row(r), vocab_);
}

}  // namespace dflash
