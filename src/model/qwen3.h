#pragma once
// The Qwen3 dense target: plain data (weights, config) plus a forward function over a
// sequence's state. It can hand back the residual stream after chosen layers (the DFlash
// context features) from the same pass that produces the logits.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/config.h"
#include "model/rope.h"
#include "model/sequence_state.h"

namespace dflash {

struct DecoderLayerWeights {
  Tensor input_norm, post_attention_norm;
  Tensor qkv_proj;  // q, k then v rows: one product for all three
  Tensor q_norm, k_norm;
  Tensor o_proj;
  Tensor gate_up_proj, down_proj;  // gate_up: gate then up rows
};

class Checkpoint;

// Loads one Qwen3-style decoder layer under `prefix` ("model.layers.3." or "layers.3.").
// Bytes of every weight of a layer: what one pass streams.
int64_t weight_bytes(const DecoderLayerWeights& w);

DecoderLayerWeights load_decoder_layer(Checkpoint& ckpt, Backend& backend, const Qwen3Config& c,
                                       const std::string& prefix);

struct ForwardOutput {
  Tensor logits;    // [rows asked for, vocab]; empty where the pass chose greedy ids instead
  Tensor features;  // [tokens, K · hidden] when feature layers were asked for
};

class Qwen3Model {
 public:
  static std::unique_ptr<Qwen3Model> load(const std::string& dir, Backend& backend);

  const Qwen3Config& config() const { return config_; }
  const GenerationConfig& generation_config() const { return generation_; }
  const std::string& dir() const { return dir_; }
  Backend& backend() const { return backend_; }
  const RopeTable& rope() const { return rope_; }

  SequenceState new_sequence(int64_t capacity) const;

  // Runs `tokens` at positions state.length() … and appends them to the state. Returns logits
  // of every row (all_logits) or of the last, and the residual stream after each layer in
  // `feature_layers` (0-based), concatenated per row in that order. With `greedy_ids` (I32
  // [rows asked for, 1], from alloc) the pass writes each of those rows' argmax there instead
  // of returning logits (Backend::matmul_normed_argmax): a greedy step that needs only ids.
  ForwardOutput forward(SequenceState& state, const std::vector<int32_t>& tokens, bool all_logits,
                        const std::vector<int>& feature_layers = {}, Tensor* greedy_ids = nullptr);
  // The same with the tokens where the backend keeps them (I32 [T, 1], Backend::embed_rows):
  // a step queued before the host has read the tokens it runs. greedy_ids may be token_ids:
  // the embedding has read them before the choice is written.
  ForwardOutput forward(SequenceState& state, const Tensor& token_ids, bool all_logits,
                        const std::vector<int>& feature_layers = {}, Tensor* greedy_ids = nullptr);

  // Weight bytes one decode step streams: every layer and the LM head (the embedding is only
  // gathered). The memory-bandwidth bound of plain decoding is bandwidth / this.
  int64_t weight_bytes_per_token() const;
  int64_t lm_head_bytes() const;

  // Borrowed by the drafter.
  const Tensor& embed_tokens() const { return embed_; }
  // logits = hidden · lm_headᵀ, on normalised hidden states (the drafter normalises with its
  // own final norm before borrowing this).
  void project_to_vocab(const NormedRows& normed_hidden, Tensor& logits) const;
  // ids ← each row's argmax of project_to_vocab, the logits not kept.
  void choose_greedy(const NormedRows& normed_hidden, Tensor& ids) const;

 private:
  Qwen3Model(Backend& b) : backend_(b) {}
  // x ← the tokens' embeddings, then normed ← the first layer's input norm of x.
  using EmbedNormed = std::function<void(Tensor& x, const Tensor& norm_w, float eps, NormedRows& normed)>;
  ForwardOutput forward_embedded(SequenceState& state, int64_t T, bool all_logits,
                                 const std::vector<int>& feature_layers, const EmbedNormed& embed_normed,
                                 Tensor* greedy_ids);
  Backend& backend_;
  std::string dir_;
  Qwen3Config config_;
  GenerationConfig generation_;
  RopeTable rope_;
  Tensor embed_, lm_head_, final_norm_;
  std::vector<DecoderLayerWeights> layers_;
};

// One decoder layer over x [T, H] in place. q rows sit at positions `q_pos`; keys/values of
// these rows are written to `cache` rows kv_pos0 … and attention covers cache rows
// 0 … kv_len − 1 with `mask`. Shared by the target (causal) and the drafter (block).
// `normed` holds rms_norm(x; w.input_norm) on entry (Backend::NormedRows, its h in s.h) and
// rms_norm(x; next_norm) on exit: the next layer's input norm, or the final norm. x_copy: the
// layer's output rows (x on exit) copied there too, as Backend::matmul_add_norm's x_copy.
struct DecoderScratch {
  Tensor h, qkv, attn, act;
};
void decoder_layer_attention_mlp(Backend& b, const DecoderLayerWeights& w, const Qwen3Config& c,
                                 const RopeTable& rope, Tensor& x, NormedRows& normed, const Tensor& next_norm,
                                 const std::vector<int32_t>& q_pos, KvCache& cache, int64_t kv_pos0, int64_t kv_len,
                                 AttentionMask mask, DecoderScratch& s, Tensor* x_copy = nullptr);
DecoderScratch make_decoder_scratch(Backend& b, const Qwen3Config& c, int64_t rows);

}  // namespace dflash
