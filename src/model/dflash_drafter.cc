#include "model/dflash_drafter.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include "util/error.h"

namespace dflash {

namespace {

const nlohmann::json* dflash_field(const nlohmann::json& j, const char* name) {
  if (j.contains("dflash_config") && j["dflash_config"].is_object() && j["dflash_config"].contains(name) &&
      !j["dflash_config"][name].is_null())
    return &j["dflash_config"][name];
  if (j.contains(name) && !j[name].is_null()) return &j[name];
  return nullptr;
}

// A dflash_field value as an int, with json_int's checks and messages (a string, a fraction or
// a number past int's range is refused, not converted).
int field_int(const nlohmann::json& v, const char* field, const std::string& path) {
  return json_int(nlohmann::json{{field, v}}, field, path);
}

int count_layers(const Checkpoint& ckpt) {
  int n = 0;
  while (ckpt.has("layers." + std::to_string(n) + ".input_layernorm.weight")) ++n;
  return n;
}

}  // namespace

std::vector<int> default_target_layer_ids(int num_target_layers, int k) {
  if (k == 1) return {num_target_layers / 2};
  std::vector<int> ids;
  for (int i = 0; i < k; ++i)
    // nearbyint rounds half to even, like the Python round() the publisher used.
    ids.push_back(static_cast<int>(std::nearbyint(1.0 + i * double(num_target_layers - 4) / (k - 1))));
  return ids;
}

int tokenizer_token_count(const std::string& target_dir) {
  const auto p = std::filesystem::path(target_dir) / "tokenizer.json";
  if (!std::filesystem::exists(p)) return 0;
  const auto j = read_json_file(p.string());
  // Ids past int's range are the tokenizer loader's to refuse; here they must not wrap.
  int64_t max_id = -1;
  auto see = [&](const nlohmann::json& v) {
    if (v.is_number_integer() && v.get<int64_t>() < std::numeric_limits<int>::max())
      max_id = std::max(max_id, v.get<int64_t>());
  };
  if (j.contains("model") && j["model"].contains("vocab") && j["model"]["vocab"].is_object())
    for (const auto& v : j["model"]["vocab"]) see(v);
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& t : j["added_tokens"])
      if (t.contains("id")) see(t["id"]);
  return static_cast<int>(max_id + 1);
}

DrafterConfig infer_drafter_config(const Checkpoint& ckpt, const Qwen3Config& target, int target_token_count) {
  const std::string path = ckpt.has_config() ? ckpt.config_path() : ckpt.dir() + " (no config.json)";
  nlohmann::json j = ckpt.config();
  DrafterConfig d;
  auto fill = [&](const char* field, const nlohmann::json& value) {
    if (!j.contains(field) || j[field].is_null()) {
      j[field] = value;
      d.guessed.push_back(std::string(field) + "=" + value.dump());
    }
  };
  if (!ckpt.has("fc.weight")) throw Error(ckpt.dir() + ": missing tensor 'fc.weight' (not a DFlash drafter?)");
  const auto& fc = ckpt.peek("fc.weight");
  if (fc.shape.size() != 2) throw Error(fc.file + ": tensor 'fc.weight' must be 2-D, has shape " + fc.shape_str());
  fill("hidden_size", fc.shape[0]);
  fill("num_hidden_layers", count_layers(ckpt));
  if (ckpt.has("layers.0.self_attn.q_norm.weight"))
    fill("head_dim", ckpt.peek("layers.0.self_attn.q_norm.weight").shape[0]);
  const int head_dim = json_int(j, "head_dim", path);
  // The head counts below are divided out of the projections' rows.
  if (head_dim <= 0) throw Error(path + ": field 'head_dim' must be positive, got " + std::to_string(head_dim));
  if (ckpt.has("layers.0.self_attn.q_proj.weight"))
    fill("num_attention_heads", ckpt.peek("layers.0.self_attn.q_proj.weight").shape[0] / head_dim);
  if (ckpt.has("layers.0.self_attn.k_proj.weight"))
    fill("num_key_value_heads", ckpt.peek("layers.0.self_attn.k_proj.weight").shape[0] / head_dim);
  if (ckpt.has("layers.0.mlp.gate_proj.weight"))
    fill("intermediate_size", ckpt.peek("layers.0.mlp.gate_proj.weight").shape[0]);
  fill("rms_norm_eps", target.rms_norm_eps);
  fill("vocab_size", target.vocab_size);
  fill("max_position_embeddings", target.max_position_embeddings);
  if (!j.contains("rope_theta") && !j.contains("rope_parameters")) j["rope_theta"] = target.rope.theta;
  d.layers = parse_qwen3_config(j, path);
  // The drafter rotates with the target's RoPE (scaling included); check_pairing reports a
  // config that states something else.
  d.layers.rope = target.rope;
  if (j.contains("layer_types") && j["layer_types"].is_array())
    for (const auto& t : j["layer_types"])
      if (t.is_string() && t.get<std::string>() != "full_attention")
        throw Error(path + ": field 'layer_types' has '" + printable(t.get<std::string>()) +
                    "' layers; only full_attention drafters are supported yet");

  const int64_t k_from_shape = target.hidden_size > 0 ? fc.shape[1] / target.hidden_size : 0;
  if (const auto* v = dflash_field(j, "block_size")) d.block_size = field_int(*v, "block_size", path);
  else { d.block_size = 16; d.guessed.push_back("block_size=16"); }
  if (const auto* v = dflash_field(j, "num_target_layers")) d.num_target_layers = field_int(*v, "num_target_layers", path);
  else {
    d.num_target_layers = target.num_hidden_layers;
    d.guessed.push_back("num_target_layers=" + std::to_string(d.num_target_layers));
  }
  if (const auto* v = dflash_field(j, "target_layer_ids")) {
    if (!v->is_array()) throw Error(path + ": field 'target_layer_ids' must be a list of integers");
    for (const auto& e : *v) {
      if (!e.is_number_integer()) throw Error(path + ": field 'target_layer_ids' must be a list of integers");
      d.target_layer_ids.push_back(field_int(e, "target_layer_ids", path));
    }
  } else {
    d.target_layer_ids = default_target_layer_ids(d.num_target_layers, static_cast<int>(std::max<int64_t>(1, k_from_shape)));
    nlohmann::json ids = d.target_layer_ids;
    d.guessed.push_back("target_layer_ids=" + ids.dump());
  }
  if (const auto* v = dflash_field(j, "mask_token_id")) {
    if (!v->is_number_integer()) throw Error(path + ": field 'mask_token_id' must be an integer");
    d.mask_token_id = field_int(*v, "mask_token_id", path);
  } else if (target_token_count > 0 && target_token_count < target.vocab_size) {
    d.mask_token_id = target_token_count;
    d.guessed.push_back("mask_token_id=" + std::to_string(d.mask_token_id));
  } else {
    throw Error(path + ": field 'mask_token_id' is missing and cannot be derived (the target has no "
                "tokenizer.json with fewer ids than its embedding rows)");
  }
  // A config written by `dflash inspect --write-config` says which of its fields were guesses;
  // they stay guesses, and keep being reported, after the round trip.
  if (j.contains("dflash_guessed_fields") && j["dflash_guessed_fields"].is_array())
    for (const auto& f : j["dflash_guessed_fields"])
      if (f.is_string()) d.guessed.push_back(f.get<std::string>() + " (guessed when this config was written)");
  return d;
}

std::vector<PairingCheck> check_pairing(const DrafterConfig& d, const Checkpoint& ckpt, const Qwen3Config& t,
                                        int target_token_count) {
  std::vector<PairingCheck> out;
  auto add = [&](const char* what, bool ok, std::string detail) { out.push_back({what, ok, std::move(detail)}); };
  const auto& fc = ckpt.peek("fc.weight");
  const int K = static_cast<int>(d.target_layer_ids.size());
  add("hidden size", d.layers.hidden_size == t.hidden_size,
      "drafter " + std::to_string(d.layers.hidden_size) + ", target " + std::to_string(t.hidden_size));
  add("fc input width", fc.shape[1] == int64_t(K) * t.hidden_size,
      "fc.weight has " + std::to_string(fc.shape[1]) + " columns; " + std::to_string(K) +
          " target layers x hidden " + std::to_string(t.hidden_size) + " = " + std::to_string(int64_t(K) * t.hidden_size));
  add("vocabulary", d.layers.vocab_size == t.vocab_size,
      "drafter vocab_size " + std::to_string(d.layers.vocab_size) + ", target embedding rows " + std::to_string(t.vocab_size));
  add("num_target_layers", d.num_target_layers == t.num_hidden_layers,
      "drafter was built for " + std::to_string(d.num_target_layers) + " target layers, target has " +
          std::to_string(t.num_hidden_layers));
  bool ids_ok = K > 0;
  std::set<int> seen;
  for (int id : d.target_layer_ids) ids_ok = ids_ok && id >= 0 && id < t.num_hidden_layers && seen.insert(id).second;
  nlohmann::json ids = d.target_layer_ids;
  add("target layer ids", ids_ok, ids.dump() + " must be distinct and within 0 … " + std::to_string(t.num_hidden_layers - 1));
  bool mask_ok = d.mask_token_id >= 0 && d.mask_token_id < t.vocab_size;
  std::string mask_detail = "mask_token_id " + std::to_string(d.mask_token_id) + ", embedding rows " + std::to_string(t.vocab_size);
  if (target_token_count > 0) {
    mask_ok = mask_ok && d.mask_token_id >= target_token_count;
    mask_detail += ", tokenizer ids 0 … " + std::to_string(target_token_count - 1) + " are real tokens";
  }
  add("mask token id", mask_ok, mask_detail);
  // RoPE: a drafter config that states other parameters than the target's was trained for
  // another model; one that states none simply inherits the target's.
  const nlohmann::json& j = ckpt.config();
  bool rope_ok = true;
  std::string rope_detail = "target " + t.rope.describe();
  if (!j.empty() && (j.contains("rope_theta") || j.contains("rope_parameters"))) {
    RopeConfig stated = parse_rope(j, t.max_position_embeddings, ckpt.config_path());
    const bool states_scaling = stated.type != "default";
    rope_ok = std::abs(stated.theta - t.rope.theta) <= 1e-6 * t.rope.theta && (!states_scaling || stated == t.rope);
    rope_detail = "drafter " + stated.describe() + ", " + rope_detail;
  }
  add("RoPE", rope_ok, rope_detail);
  const bool own_head = ckpt.has("lm_head.weight") || ckpt.has("d2t") || ckpt.has("t2d");
  add("LM head", !own_head,
      own_head ? "the drafter carries its own LM head / draft vocabulary map (speculators format); "
                 "replacing it with the target's would silently break drafting"
               : "borrows the target's embedding and LM head");
  add("block size", d.block_size >= 2 && d.block_size <= 64, "block_size " + std::to_string(d.block_size));
  return out;
}

std::unique_ptr<DFlashDrafter> DFlashDrafter::load(const std::string& dir, const Qwen3Model& target,
                                                   std::vector<std::string>* warnings) {
  Checkpoint ckpt = Checkpoint::open(dir, /*require_config=*/false);
  const int token_count = tokenizer_token_count(target.dir());
  std::unique_ptr<DFlashDrafter> d(new DFlashDrafter(target));
  d->config_ = infer_drafter_config(ckpt, target.config(), token_count);
  for (const auto& c : check_pairing(d->config_, ckpt, target.config(), token_count))
    if (!c.ok) throw Error(dir + ": drafter does not fit target " + target.dir() + ": " + c.what + ": " + c.detail);
  if (warnings)
    for (const auto& g : d->config_.guessed)
      warnings->push_back(dir + ": config field guessed, not stated: " + g);
  const Qwen3Config& c = d->config_.layers;
  Backend& b = target.backend();
  const int64_t H = c.hidden_size, K = static_cast<int64_t>(d->config_.target_layer_ids.size());
  d->rope_ = RopeTable(c.rope, c.head_dim, ckpt.config_path());
  d->fc_ = b.upload_weight({&ckpt.get("fc.weight", {H, K * target.config().hidden_size})});
  d->hidden_norm_ = b.upload_weight({&ckpt.get("hidden_norm.weight", {H})});
  d->final_norm_ = b.upload_weight({&ckpt.get("norm.weight", {H})});
  const int64_t kv_rows = int64_t(c.num_key_value_heads) * c.head_dim;
  std::vector<const TensorInfo*> context_kv;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string prefix = "layers." + std::to_string(i) + ".";
    d->layers_.push_back(load_decoder_layer(ckpt, b, c, prefix));
    for (const char* name : {"self_attn.k_proj.weight", "self_attn.v_proj.weight"})
      context_kv.push_back(&ckpt.get(prefix + name, {kv_rows, H}));
  }
  d->context_kv_proj_ = b.upload_weight(context_kv);
  ckpt.check_all_used();
  return d;
}

int64_t DFlashDrafter::weight_bytes_per_step() const {
  int64_t total = fc_.nbytes() + hidden_norm_.nbytes() + final_norm_.nbytes() + target_.lm_head_bytes();
  for (const auto& l : layers_) total += weight_bytes(l);
  return total;
}

SequenceState DFlashDrafter::new_sequence(int64_t capacity) const {
  Backend& b = target_.backend();
  const int64_t cols = int64_t(config_.layers.num_key_value_heads) * config_.layers.head_dim;
  std::vector<KvCache> kv;
  for (size_t i = 0; i < layers_.size(); ++i)
    kv.push_back({b.alloc(capacity, cols, b.activation_dtype()), b.alloc(capacity, cols, b.activation_dtype())});
  return SequenceState(std::move(kv), capacity);
}

void DFlashDrafter::add_context(SequenceState& state, const Tensor& features) {
  Backend& b = target_.backend();
  const Qwen3Config& c = config_.layers;
  const int64_t m = features.rows, H = c.hidden_size;
  if (m == 0) return;
  if (state.length() + m > state.capacity())
    throw Error("drafter context exhausted: " + std::to_string(state.length() + m) + " rows needed, " +
                std::to_string(state.capacity()) + " allocated");
  rope_.ensure(state.length() + m);
  const DType dt = b.activation_dtype();
  Tensor projected = b.alloc(m, H, DType::F32), ctx = b.alloc(m, H, dt);
  b.matmul(features, fc_, projected);
  b.rms_norm(projected, hidden_norm_, static_cast<float>(c.rms_norm_eps), H, ctx);
  std::vector<int32_t> pos(m);
  for (int64_t i = 0; i < m; ++i) pos[i] = static_cast<int32_t>(state.length() + i);
  const int64_t kv_cols = 2 * int64_t(c.num_key_value_heads) * c.head_dim;
  Tensor kv = b.alloc(m, kv_cols * int64_t(layers_.size()), dt);
  b.matmul(ctx, context_kv_proj_, kv);
  // Every layer's rows in one call (one launch on the GPU instead of a launch a layer).
  std::vector<Backend::KvRows> stores;
  const int64_t half = kv_cols / 2;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Tensor layer_kv = kv.slice_cols(int64_t(l) * kv_cols, kv_cols);
    KvCache& cache = state.kv(l);
    stores.push_back({layer_kv.slice_cols(0, half), layer_kv.slice_cols(half, half), layers_[l].k_norm,
                      cache.k.slice_rows(state.length(), m), cache.v.slice_rows(state.length(), m)});
  }
  b.kv_norm_rope_store(stores, static_cast<float>(c.rms_norm_eps), pos, c.head_dim, rope_);
  state.advance(m);
}

Tensor DFlashDrafter::draft(SequenceState& state, int32_t anchor, int block_size, int rows, Tensor* greedy_ids) {
  Backend& b = target_.backend();
  const Qwen3Config& c = config_.layers;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int64_t H = c.hidden_size, B = block_size;
  if (B < 2) throw Error("drafting needs a block of at least 2 rows");
  const int64_t R = rows > 0 ? std::min<int64_t>(rows, B) : B;
  if (state.length() + B > state.capacity())
    throw Error("drafter context exhausted: " + std::to_string(state.length() + B) + " rows needed, " +
                std::to_string(state.capacity()) + " allocated");
  rope_.ensure(state.length() + B);

  // The block's own keys/values go to rows s … s+B−1 without advancing the state: the next
  // step's context rows overwrite them.
  const int64_t s = state.length();
  std::vector<int32_t> ids(B, config_.mask_token_id);
  ids[0] = anchor;
  std::vector<int32_t> pos(B);
  for (int64_t i = 0; i < B; ++i) pos[i] = static_cast<int32_t>(s + i);
  Tensor x = b.alloc(B, H, DType::F32);  // the residual stream, f32 as in the target
  DecoderScratch scratch = make_decoder_scratch(b, c, B);
  NormedRows normed;
  normed.h = scratch.h.slice_rows(0, B);
  b.embed_normed(ids, target_.embed_tokens(), x, layers_[0].input_norm, eps, normed);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Tensor& next_norm = l + 1 < layers_.size() ? layers_[l + 1].input_norm : final_norm_;
    decoder_layer_attention_mlp(b, layers_[l], c, rope_, x, normed, next_norm, pos, state.kv(l), s, s + B,
                                AttentionMask::None, scratch);
  }
  // Rows 1 … R − 1 predict the drafted tokens; normed holds every row's final norm.
  if (greedy_ids) {
    target_.choose_greedy(normed.slice_rows(1, R - 1), *greedy_ids);
    return {};
  }
  Tensor logits = b.alloc(R - 1, target_.config().vocab_size, DType::F32);  // logits stay f32 on every backend
  target_.project_to_vocab(normed.slice_rows(1, R - 1), logits);
  return logits;
}

}  // namespace dflash
