#include "model/qwen3.h"

#include <algorithm>
#include <filesystem>
#include <functional>

#include "io/checkpoint.h"
#include "util/error.h"

namespace dflash {

DecoderLayerWeights load_decoder_layer(Checkpoint& ckpt, Backend& b, const Qwen3Config& c,
                                       const std::string& prefix) {
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int64_t q_rows = int64_t(c.num_attention_heads) * D, kv_rows = int64_t(c.num_key_value_heads) * D;
  auto one = [&](const std::string& name, std::vector<int64_t> shape) {
    return b.upload_weight({&ckpt.get(prefix + name, shape)});
  };
  const TensorInfo& q = ckpt.get(prefix + "self_attn.q_proj.weight", {q_rows, H});
  const TensorInfo& k = ckpt.get(prefix + "self_attn.k_proj.weight", {kv_rows, H});
  const TensorInfo& v = ckpt.get(prefix + "self_attn.v_proj.weight", {kv_rows, H});
  DecoderLayerWeights w;
  w.input_norm = one("input_layernorm.weight", {H});
  w.post_attention_norm = one("post_attention_layernorm.weight", {H});
  w.qkv_proj = b.upload_weight({&q, &k, &v});
  w.q_norm = one("self_attn.q_norm.weight", {D});
  w.k_norm = one("self_attn.k_norm.weight", {D});
  w.o_proj = one("self_attn.o_proj.weight", {H, q_rows});
  w.gate_up_proj = b.upload_weight({&ckpt.get(prefix + "mlp.gate_proj.weight", {I, H}),
                                    &ckpt.get(prefix + "mlp.up_proj.weight", {I, H})});
  w.down_proj = one("mlp.down_proj.weight", {H, I});
  return w;
}

int64_t weight_bytes(const DecoderLayerWeights& w) {
  int64_t total = 0;
  for (const Tensor* t : {&w.input_norm, &w.post_attention_norm, &w.qkv_proj, &w.q_norm, &w.k_norm,
                          &w.o_proj, &w.gate_up_proj, &w.down_proj})
    total += t->nbytes();
  return total;
}

DecoderScratch make_decoder_scratch(Backend& b, const Qwen3Config& c, int64_t rows) {
  const DType dt = b.activation_dtype();
  const int64_t D = c.head_dim;
  DecoderScratch s;
  s.h = b.alloc(rows, c.hidden_size, dt);
  s.qkv = b.alloc(rows, (c.num_attention_heads + 2 * c.num_key_value_heads) * D, dt);
  s.attn = b.alloc(rows, c.num_attention_heads * D, dt);
  s.act = b.alloc(rows, c.intermediate_size, dt);
  return s;
}

void decoder_layer_attention_mlp(Backend& b, const DecoderLayerWeights& w, const Qwen3Config& c,
                                 const RopeTable& rope, Tensor& x, NormedRows& normed, const Tensor& next_norm,
                                 const std::vector<int32_t>& q_pos, KvCache& cache, int64_t kv_pos0, int64_t kv_len,
                                 AttentionMask mask, DecoderScratch& s, Tensor* x_copy) {
  const int64_t T = x.rows, D = c.head_dim;
  const int64_t q_cols = int64_t(c.num_attention_heads) * D, kv_cols = int64_t(c.num_key_value_heads) * D;
  const float eps = static_cast<float>(c.rms_norm_eps);
  Tensor qkv = s.qkv.slice_rows(0, T), attn = s.attn.slice_rows(0, T);
  b.matmul_normed(normed, w.qkv_proj, qkv);
  Tensor q = qkv.slice_cols(0, q_cols);
  Tensor k_dst = cache.k.slice_rows(kv_pos0, T), v_dst = cache.v.slice_rows(kv_pos0, T);
  b.qk_norm_rope_store(q, qkv.slice_cols(q_cols, kv_cols), qkv.slice_cols(q_cols + kv_cols, kv_cols), w.q_norm,
                       w.k_norm, eps, q_pos, D, rope, k_dst, v_dst);
  b.attention(q, cache.k, cache.v, kv_len, q_pos[0], D, mask, attn);
  // The residual adds and the norms after them: normed.h (s.h) is reused, each norm being
  // consumed by the product right after it.
  b.matmul_add_norm(attn, w.o_proj, x, w.post_attention_norm, eps, normed);
  Tensor act = s.act.slice_rows(0, T);
  b.matmul_silu_mul_normed(normed, w.gate_up_proj, act);
  b.matmul_add_norm(act, w.down_proj, x, next_norm, eps, normed, x_copy);
}

std::unique_ptr<Qwen3Model> Qwen3Model::load(const std::string& dir, Backend& b) {
  Checkpoint ckpt = Checkpoint::open(dir);
  std::unique_ptr<Qwen3Model> m(new Qwen3Model(b));
  m->dir_ = dir;
  m->config_ = parse_qwen3_config(ckpt.config(), ckpt.config_path());
  const Qwen3Config& c = m->config_;
  if (!c.architecture.empty() && c.architecture != "Qwen3ForCausalLM")
    throw Error(ckpt.config_path() + ": field 'architectures' is " + c.architecture +
                ", this loader reads Qwen3ForCausalLM");
  m->generation_ = load_generation_config(dir, ckpt.config());
  m->rope_ = RopeTable(c.rope, c.head_dim, ckpt.config_path());
  const int64_t V = c.vocab_size, H = c.hidden_size;
  m->embed_ = b.upload_weight({&ckpt.get("model.embed_tokens.weight", {V, H})});
  m->final_norm_ = b.upload_weight({&ckpt.get("model.norm.weight", {H})});
  if (c.tie_word_embeddings) {
    m->lm_head_ = m->embed_;
    if (ckpt.has("lm_head.weight")) ckpt.get("lm_head.weight", {V, H});  // some exports keep the copy
  } else {
    if (!ckpt.has("lm_head.weight"))
      throw Error(dir + ": missing tensor 'lm_head.weight' (config.json says tie_word_embeddings is false)");
    m->lm_head_ = b.upload_weight({&ckpt.get("lm_head.weight", {V, H})});
  }
  for (int i = 0; i < c.num_hidden_layers; ++i)
    m->layers_.push_back(load_decoder_layer(ckpt, b, c, "model.layers." + std::to_string(i) + "."));
  ckpt.check_all_used();
  return m;
}

SequenceState Qwen3Model::new_sequence(int64_t capacity) const {
  std::vector<KvCache> kv;
  const int64_t cols = int64_t(config_.num_key_value_heads) * config_.head_dim;
  const DType dt = backend_.activation_dtype();
  for (size_t i = 0; i < layers_.size(); ++i)
    kv.push_back({backend_.alloc(capacity, cols, dt), backend_.alloc(capacity, cols, dt)});
  return SequenceState(std::move(kv), capacity);
}

int64_t Qwen3Model::weight_bytes_per_token() const {
  int64_t total = lm_head_.nbytes() + final_norm_.nbytes();
  for (const auto& l : layers_) total += weight_bytes(l);
  return total;
}

int64_t Qwen3Model::lm_head_bytes() const { return lm_head_.nbytes(); }

void Qwen3Model::project_to_vocab(const NormedRows& normed_hidden, Tensor& logits) const {
  backend_.matmul_normed(normed_hidden, lm_head_, logits);
}

void Qwen3Model::choose_greedy(const NormedRows& normed_hidden, Tensor& ids) const {
  backend_.matmul_normed_argmax(normed_hidden, lm_head_, ids);
}

ForwardOutput Qwen3Model::forward(SequenceState& state, const std::vector<int32_t>& tokens,
                                  bool all_logits, const std::vector<int>& feature_layers, Tensor* greedy_ids) {
  return forward_embedded(state, static_cast<int64_t>(tokens.size()), all_logits, feature_layers,
                          [&](Tensor& x, const Tensor& norm_w, float eps, NormedRows& normed) {
                            backend_.embed_normed(tokens, embed_, x, norm_w, eps, normed);
                          },
                          greedy_ids);
}

ForwardOutput Qwen3Model::forward(SequenceState& state, const Tensor& token_ids, bool all_logits,
                                  const std::vector<int>& feature_layers, Tensor* greedy_ids) {
  return forward_embedded(state, token_ids.rows, all_logits, feature_layers,
                          [&](Tensor& x, const Tensor& norm_w, float eps, NormedRows& normed) {
                            backend_.embed_rows_normed(token_ids, embed_, x, norm_w, eps, normed);
                          },
                          greedy_ids);
}

ForwardOutput Qwen3Model::forward_embedded(SequenceState& state, int64_t T, bool all_logits,
                                           const std::vector<int>& feature_layers,
                                           const EmbedNormed& embed_normed, Tensor* greedy_ids) {
  Backend& b = backend_;
  const Qwen3Config& c = config_;
  const int64_t H = c.hidden_size;
  const int64_t pos0 = state.length();
  if (T == 0) throw Error("forward: no tokens");
  if (pos0 + T > state.capacity())
    throw Error("context length exceeded: " + std::to_string(pos0 + T) + " positions needed, the sequence holds " +
                std::to_string(state.capacity()));
  for (int l : feature_layers)
    if (l < 0 || l >= c.num_hidden_layers)
      throw Error("feature layer " + std::to_string(l) + " is outside the target's " +
                  std::to_string(c.num_hidden_layers) + " layers");
  rope_.ensure(pos0 + T);

  std::vector<int32_t> positions(T);
  for (int64_t t = 0; t < T; ++t) positions[t] = static_cast<int32_t>(pos0 + t);
  const DType dt = b.activation_dtype();
  // The residual stream stays f32 on every backend: each layer adds two products into it, and
  // rounding it to bf16 after every add is most of a bf16 engine's distance from f32.
  Tensor x = b.alloc(T, H, DType::F32);
  DecoderScratch scratch = make_decoder_scratch(b, c, T);

  ForwardOutput out;
  if (!feature_layers.empty()) out.features = b.alloc(T, H * int64_t(feature_layers.size()), dt);
  const float eps = static_cast<float>(c.rms_norm_eps);
  NormedRows normed;
  normed.h = scratch.h.slice_rows(0, T);
  embed_normed(x, layers_[0].input_norm, eps, normed);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const Tensor& next_norm = i + 1 < c.num_hidden_layers ? layers_[i + 1].input_norm : final_norm_;
    // transformers' hidden_states[L] (what drafters are trained on) is taken after the final
    // norm; every earlier entry is the raw residual stream, which the layer's last product
    // copies as it adds (into its first slot, should a layer be listed twice).
    const bool last = i + 1 == c.num_hidden_layers;
    const size_t first_slot = size_t(std::find(feature_layers.begin(), feature_layers.end(), i) - feature_layers.begin());
    const bool layer_copies = !last && first_slot < feature_layers.size();
    Tensor copied = layer_copies ? out.features.slice_cols(int64_t(first_slot) * H, H) : Tensor{};
    decoder_layer_attention_mlp(b, layers_[i], c, rope_, x, normed, next_norm, positions, state.kv(i), pos0, pos0 + T,
                                AttentionMask::Causal, scratch, layer_copies ? &copied : nullptr);
    for (size_t k = 0; k < feature_layers.size(); ++k) {
      if (feature_layers[k] != i || (layer_copies && k == first_slot)) continue;
      Tensor dst = out.features.slice_cols(int64_t(k) * H, H);
      if (last) b.rms_norm(x, final_norm_, eps, H, dst);
      else b.copy(x, dst);
    }
  }
  state.advance(T);

  // normed: the final norm of every row (left by the last layer).
  const int64_t rows = all_logits ? T : 1;
  if (greedy_ids) {
    choose_greedy(normed.slice_rows(T - rows, rows), *greedy_ids);
    return out;
  }
  out.logits = b.alloc(rows, c.vocab_size, DType::F32);  // f32 on every backend: sampling and argmax need it
  project_to_vocab(normed.slice_rows(T - rows, rows), out.logits);
  return out;
}

}  // namespace dflash
