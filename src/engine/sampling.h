#pragma once
// Turning a row of logits into the next token the way transformers' generate does: logit
// bias and penalties, then temperature, top-k, top-p and min-p, then a draw. The same
// transforms produce the drafter's q and the target's p for speculative sampling.
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "backend/backend.h"  // PenaltyTokens

namespace dflash {

struct SamplingParams {
  double temperature = 0.0;  // 0 → greedy
  int top_k = 0;             // 0 → off
  double top_p = 1.0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;  // over prompt and output, as transformers applies it
  double presence_penalty = 0.0;    // over output tokens, as the OpenAI API defines it
  double frequency_penalty = 0.0;   // × each output token's count, as the OpenAI API defines it
  // Added to those tokens' logits before the penalties (the OpenAI API's logit_bias); an id
  // at most once.
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0.0; }
  // Greedy with nothing that needs the host's view of the logits: the backend's argmax is
  // the whole choice, so only token ids leave the device.
  bool penalised() const {
    return repetition_penalty != 1.0 || presence_penalty != 0.0 || frequency_penalty != 0.0 || !logit_bias.empty();
  }
  bool argmax_only() const { return greedy() && !penalised(); }
  // The warpers alone: what is left to apply once the penalties and the bias have been.
  SamplingParams without_penalties() const {
    SamplingParams w = *this;
    w.repetition_penalty = 1.0;
    w.presence_penalty = w.frequency_penalty = 0.0;
    w.logit_bias.clear();
    return w;
  }
};

// Validates ranges; throws dflash::Error naming the parameter.
void validate(const SamplingParams& p);

// Reproducible draws: the same seed gives the same stream on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double uniform() { return static_cast<double>(engine_() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  std::mt19937_64 engine_;
};

// Token history a row's penalties look at: the prompt, and the output before this row.
struct TokenHistory {
  const std::vector<int32_t>* prompt = nullptr;
  const std::vector<int32_t>* output = nullptr;
  const int32_t* extra = nullptr;  // tokens after `output` (drafted, not yet committed)
  int extra_count = 0;
};

// A distribution over the vocabulary kept as its support: the tokens a row can yield, in
// ascending id order, with their probabilities; every other token has probability 0. After
// top-k or top-p a support is a few dozen tokens, so drawing from it, and the acceptance
// rule's p(d)/q(d) and max(0, p − q), cost that many steps instead of a vocabulary's.
struct TokenDistribution {
  std::vector<int32_t> ids;  // ascending
  std::vector<float> probs;  // probs[j] is the probability of ids[j]

  float prob(int32_t id) const;               // 0 outside the support
  std::vector<float> dense(int vocab) const;  // the vocabulary-sized vector (tests)
};

// A token distribution as drawing and the acceptance rule use it: a support on the host
// (SupportLaw), or a whole row's softmax left on the device (engine/logit_rows.cc).
class TokenLaw {
 public:
  virtual ~TokenLaw() = default;
  virtual double prob(int32_t id) const = 0;
  virtual int32_t draw(Rng& rng) const = 0;
  // A draw from normalise(max(0, this − q)); −1 when that is 0 everywhere.
  virtual int32_t draw_excess_over(const TokenLaw& q, Rng& rng) const = 0;
  // The law as a support on the host (a row on the device is read for it): where p and q are of
  // different kinds (a top-p row that came as candidates beside one whose nucleus stayed on the
  // device), the excess is drawn on the host.
  virtual TokenDistribution support() const = 0;
};

class SupportLaw final : public TokenLaw {
 public:
  explicit SupportLaw(TokenDistribution d) : d_(std::move(d)) {}
  const TokenDistribution& distribution() const { return d_; }
  double prob(int32_t id) const override;
  int32_t draw(Rng& rng) const override;
  // max(0, p − q) is 0 wherever p is, so its support is within p's: one merge walk of the two
  // ascending supports. No uniform is drawn when it is 0 everywhere.
  int32_t draw_excess_over(const TokenLaw& q, Rng& rng) const override;
  TokenDistribution support() const override { return d_; }

 private:
  TokenDistribution d_;
};

// In place on one row of `vocab` logits: the logit bias, then the repetition penalty over the
// distinct tokens of prompt, output and extra (x < 0 ? x · r : x / r, as transformers' processor
// after its sequence bias), then for each distinct output or extra token one subtraction of
// penalty_subtract (count · frequency + presence, the OpenAI API's two penalties).
void apply_penalties(float* logits, int vocab, const SamplingParams& p, const TokenHistory& h);
float penalty_subtract(const SamplingParams& p, int count);  // rounded once, from f64
// apply_penalties for `rows` rows of a causal block, as Backend::apply_penalties takes them: row
// r's history is h with its first min(r, h.extra_count) extra tokens (a verification's rows see
// the drafts before them; with no extra, every row sees h).
PenaltyTokens penalty_tokens(const SamplingParams& p, int vocab, const TokenHistory& h, int rows);
// penalty_tokens over a generation, whose prompt and output only grow: each call takes only the
// tokens added since the last (a 32 768-token history cost 3.8 ms a step taken whole), and
// starts again when handed another prompt or output.
class PenaltyHistory {
 public:
  PenaltyHistory(const SamplingParams& p, int vocab);
  PenaltyTokens tokens(const TokenHistory& h, int rows);

 private:
  PenaltyEntry& entry(int32_t id);

  SamplingParams p_;
  int vocab_;
  const std::vector<int32_t>* prompt_ = nullptr;
  const std::vector<int32_t>* output_ = nullptr;
  size_t prompt_taken_ = 0, output_taken_ = 0;
  std::vector<int32_t> at_;     // a token's entry in every_row_, −1 for none
  std::vector<int32_t> count_;  // a token's count in the output
  std::vector<PenaltyEntry> every_row_;
};

// The distribution the request samples from, after penalties and warpers; greedy gives the
// argmax alone, with probability 1.
TokenDistribution token_distribution(const float* logits, int vocab, const SamplingParams& p,
                                      const TokenHistory& h);

// The same distribution from candidates (ascending ids and their logits · 1/temperature): the
// survivors of top-k (Backend::top_k_rows), or, with row_mass > 0, top-p's candidates and the
// whole row's Σ exp(scaled − max) (Backend::top_p_rows). Then top-p, min-p and the softmax on
// those. Equal to token_distribution of the whole row when no penalty applies (with row_mass,
// to the rounding of that sum).
TokenDistribution distribution_of_candidates(std::vector<int32_t> ids, std::vector<float> scaled,
                                             const SamplingParams& p, double row_mass = 0);

// One uniform draw, walked through the support in id order (the same token a walk over the
// dense vector would give).
int32_t sample_from(const TokenDistribution& d, Rng& rng);
int32_t argmax(const float* v, int n);

}  // namespace dflash
