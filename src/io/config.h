#pragma once
// Model configurations read from Hugging Face config.json files, in either the layout
// transformers 4.x writes (rope_theta, rope_scaling) or the one 5.x writes (rope_parameters).
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace dflash {

struct RopeConfig {
  std::string type = "default";  // default | linear | yarn | llama3
  double theta = 10000.0;
  double factor = 1.0;
  int original_max_position_embeddings = 0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double beta_fast = 32.0, beta_slow = 1.0;             // yarn
  std::optional<double> attention_factor, mscale, mscale_all_dim;
  bool truncate = true;

  bool operator==(const RopeConfig&) const = default;
  std::string describe() const;
};

struct Qwen3Config {
  std::string architecture;
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  double rms_norm_eps = 1e-6;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  RopeConfig rope;
};

struct DrafterConfig {
  Qwen3Config layers;  // the drafter's own decoder stack (vocab_size mirrors the target's)
  int block_size = 16;
  int num_target_layers = 0;
  int mask_token_id = -1;
  std::vector<int> target_layer_ids;
  // Fields the checkpoint did not state and that were filled from shapes or defaults.
  std::vector<std::string> guessed;
};

struct GenerationConfig {
  std::vector<int> eos_token_ids;
  std::optional<int> bos_token_id;
  std::optional<int> pad_token_id;
  // Sampling defaults a publisher may ship; the request may override them.
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::optional<bool> do_sample;
};

// Reads the RoPE parameters from either layout. `path` names the file in errors.
RopeConfig parse_rope(const nlohmann::json& j, int max_position_embeddings, const std::string& path);
Qwen3Config parse_qwen3_config(const nlohmann::json& j, const std::string& path);
// Missing fields that the tensor shapes determine must already be filled in `j` by the caller
// (see model/dflash_drafter.cc); this only reads and validates.
GenerationConfig parse_generation_config(const nlohmann::json& j, const std::string& path);
// generation_config.json in `dir`, or defaults (eos from config.json) when absent.
GenerationConfig load_generation_config(const std::string& dir, const nlohmann::json& model_config);

// Typed field access with errors that name the file and field.
int json_int(const nlohmann::json& j, const char* field, const std::string& path);
double json_double(const nlohmann::json& j, const char* field, const std::string& path);
int json_int_or(const nlohmann::json& j, const char* field, int fallback, const std::string& path);
double json_double_or(const nlohmann::json& j, const char* field, double fallback, const std::string& path);
bool json_bool_or(const nlohmann::json& j, const char* field, bool fallback, const std::string& path);

}  // namespace dflash
