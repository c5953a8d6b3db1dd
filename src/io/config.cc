#include "io/config.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "io/checkpoint.h"
#include "util/error.h"

namespace dflash {

namespace {
std::string field_error(const std::string& path, const char* field, const std::string& what) {
  return path + ": field '" + field + "' " + what;
}

// An integral JSON number that fits in an int. Out-of-range values must be refused, not
// wrapped or cast: casting a double like 1e300 to int is undefined behaviour.
bool integral_int(const nlohmann::json& v, int* out) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > uint64_t(std::numeric_limits<int>::max())) return false;
    *out = static_cast<int>(v.get<uint64_t>());
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max()) return false;
    *out = static_cast<int>(x);
    return true;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!(d >= std::numeric_limits<int>::min() && d <= std::numeric_limits<int>::max()) || d != std::floor(d)) return false;
    *out = static_cast<int>(d);
    return true;
  }
  return false;
}

}  // namespace

int json_int(const nlohmann::json& j, const char* field, const std::string& path) {
  if (!j.contains(field) || j[field].is_null()) throw Error(field_error(path, field, "is missing"));
  const auto& v = j[field];
  int out = 0;
  if (integral_int(v, &out)) return out;
  if (v.is_number_integer()) throw Error(field_error(path, field, "is out of range, got " + v.dump()));
  throw Error(field_error(path, field, "must be an integer, got " + v.dump()));
}

double json_double(const nlohmann::json& j, const char* field, const std::string& path) {
  if (!j.contains(field) || j[field].is_null()) throw Error(field_error(path, field, "is missing"));
  const auto& v = j[field];
  if (!v.is_number()) throw Error(field_error(path, field, "must be a number, got " + v.dump()));
  return v.get<double>();
}

int json_int_or(const nlohmann::json& j, const char* field, int fallback, const std::string& path) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  return json_int(j, field, path);
}

double json_double_or(const nlohmann::json& j, const char* field, double fallback,
                      const std::string& path) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  return json_double(j, field, path);
}

bool json_bool_or(const nlohmann::json& j, const char* field, bool fallback, const std::string& path) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  if (!j[field].is_boolean()) throw Error(field_error(path, field, "must be true or false"));
  return j[field].get<bool>();
}

std::string RopeConfig::describe() const {
  std::string s = type + " theta=" + std::to_string(theta);
  if (type != "default") s += " factor=" + std::to_string(factor);
  if (type == "yarn" || type == "llama3")
    s += " original_max_position_embeddings=" + std::to_string(original_max_position_embeddings);
  return s;
}

RopeConfig parse_rope(const nlohmann::json& j, int max_position_embeddings, const std::string& path) {
  RopeConfig r;
  // 5.x: everything in rope_parameters; 4.x: rope_theta at the top, scaling in rope_scaling.
  nlohmann::json params = nlohmann::json::object();
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) params = j["rope_parameters"];
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    for (auto it = j["rope_scaling"].begin(); it != j["rope_scaling"].end(); ++it)
      if (!params.contains(it.key())) params[it.key()] = it.value();
  } else if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    throw Error(field_error(path, "rope_scaling", "must be an object or null"));
  }
  if (params.contains("rope_theta")) r.theta = json_double(params, "rope_theta", path + " (rope_parameters)");
  else if (j.contains("rope_theta")) r.theta = json_double(j, "rope_theta", path);
  else throw Error(field_error(path, "rope_theta", "is missing (neither top-level nor in rope_parameters)"));
  // Frequencies are powers of theta: a base of zero or below gives infinities and NaNs.
  if (!(r.theta > 0)) throw Error(field_error(path, "rope_theta", "must be positive, got " + std::to_string(r.theta)));

  if (params.contains("rope_type") && params["rope_type"].is_string()) r.type = params["rope_type"].get<std::string>();
  else if (params.contains("type") && params["type"].is_string()) r.type = params["type"].get<std::string>();
  const std::string ppath = path + " (rope scaling)";
  if (r.type == "default") return r;
  if (r.type != "linear" && r.type != "yarn" && r.type != "llama3")
    throw Error(field_error(path, "rope_type", "'" + printable(r.type) + "' is not supported (default, linear, yarn, llama3)"));
  r.original_max_position_embeddings =
      json_int_or(params, "original_max_position_embeddings",
                  json_int_or(j, "original_max_position_embeddings", max_position_embeddings, path), ppath);
  if (params.contains("factor") && !params["factor"].is_null()) r.factor = json_double(params, "factor", ppath);
  else if (r.type == "yarn" && r.original_max_position_embeddings > 0)
    r.factor = static_cast<double>(max_position_embeddings) / r.original_max_position_embeddings;
  else throw Error(field_error(ppath, "factor", "is missing"));
  if (r.type == "llama3") {
    r.low_freq_factor = json_double(params, "low_freq_factor", ppath);
    r.high_freq_factor = json_double(params, "high_freq_factor", ppath);
  }
  if (r.type == "yarn") {
    // transformers treats 0 or null as "use the default" here (`or 32`).
    double bf = json_double_or(params, "beta_fast", 0.0, ppath);
    double bs = json_double_or(params, "beta_slow", 0.0, ppath);
    r.beta_fast = bf != 0.0 ? bf : 32.0;
    r.beta_slow = bs != 0.0 ? bs : 1.0;
    if (params.contains("attention_factor") && !params["attention_factor"].is_null())
      r.attention_factor = json_double(params, "attention_factor", ppath);
    if (params.contains("mscale") && !params["mscale"].is_null()) r.mscale = json_double(params, "mscale", ppath);
    if (params.contains("mscale_all_dim") && !params["mscale_all_dim"].is_null())
      r.mscale_all_dim = json_double(params, "mscale_all_dim", ppath);
    r.truncate = json_bool_or(params, "truncate", true, ppath);
  }
  return r;
}

Qwen3Config parse_qwen3_config(const nlohmann::json& j, const std::string& path) {
  Qwen3Config c;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    c.architecture = j["architectures"][0].get<std::string>();
  c.vocab_size = json_int(j, "vocab_size", path);
  c.hidden_size = json_int(j, "hidden_size", path);
  c.intermediate_size = json_int(j, "intermediate_size", path);
  c.num_hidden_layers = json_int(j, "num_hidden_layers", path);
  c.num_attention_heads = json_int(j, "num_attention_heads", path);
  c.num_key_value_heads = json_int_or(j, "num_key_value_heads", c.num_attention_heads, path);
  if (c.num_attention_heads <= 0) throw Error(field_error(path, "num_attention_heads", "must be positive"));
  c.head_dim = json_int_or(j, "head_dim", c.hidden_size / c.num_attention_heads, path);
  c.rms_norm_eps = json_double_or(j, "rms_norm_eps", 1e-6, path);
  c.max_position_embeddings = json_int(j, "max_position_embeddings", path);
  c.tie_word_embeddings = json_bool_or(j, "tie_word_embeddings", false, path);
  c.rope = parse_rope(j, c.max_position_embeddings, path);
  auto positive = [&](int v, const char* f) {
    if (v <= 0) throw Error(field_error(path, f, "must be positive, got " + std::to_string(v)));
  };
  positive(c.vocab_size, "vocab_size");
  positive(c.hidden_size, "hidden_size");
  positive(c.intermediate_size, "intermediate_size");
  positive(c.num_hidden_layers, "num_hidden_layers");
  positive(c.num_key_value_heads, "num_key_value_heads");
  positive(c.head_dim, "head_dim");
  positive(c.max_position_embeddings, "max_position_embeddings");
  if (c.head_dim % 2) throw Error(field_error(path, "head_dim", "must be even for RoPE"));
  if (c.num_attention_heads % c.num_key_value_heads)
    throw Error(field_error(path, "num_key_value_heads", "must divide num_attention_heads"));
  if (json_bool_or(j, "use_sliding_window", false, path))
    throw Error(field_error(path, "use_sliding_window", "true is not supported yet"));
  return c;
}

namespace {
std::vector<int> int_or_list(const nlohmann::json& v, const std::string& path, const char* field) {
  std::vector<int> out;
  if (v.is_null()) return out;
  if (v.is_number_integer()) {
    int x = 0;
    if (!integral_int(v, &x)) throw Error(field_error(path, field, "is out of range, got " + v.dump()));
    return {x};
  }
  if (v.is_array()) {
    for (const auto& e : v) {
      int x = 0;
      if (!e.is_number_integer() || !integral_int(e, &x)) throw Error(field_error(path, field, "must hold integers"));
      out.push_back(x);
    }
    return out;
  }
  throw Error(field_error(path, field, "must be an integer or a list of integers"));
}
}  // namespace

GenerationConfig parse_generation_config(const nlohmann::json& j, const std::string& path) {
  GenerationConfig g;
  if (!j.is_object()) throw Error(path + ": expected a JSON object");
  if (j.contains("eos_token_id")) g.eos_token_ids = int_or_list(j["eos_token_id"], path, "eos_token_id");
  int id = 0;
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer() && integral_int(j["bos_token_id"], &id)) g.bos_token_id = id;
  if (j.contains("pad_token_id") && j["pad_token_id"].is_number_integer() && integral_int(j["pad_token_id"], &id)) g.pad_token_id = id;
  if (j.contains("temperature") && j["temperature"].is_number()) g.temperature = json_double(j, "temperature", path);
  if (j.contains("top_p") && j["top_p"].is_number()) g.top_p = json_double(j, "top_p", path);
  if (j.contains("min_p") && j["min_p"].is_number()) g.min_p = json_double(j, "min_p", path);
  if (j.contains("repetition_penalty") && j["repetition_penalty"].is_number())
    g.repetition_penalty = json_double(j, "repetition_penalty", path);
  if (j.contains("top_k") && j["top_k"].is_number_integer()) g.top_k = json_int(j, "top_k", path);
  if (j.contains("do_sample") && j["do_sample"].is_boolean()) g.do_sample = j["do_sample"].get<bool>();
  return g;
}

GenerationConfig load_generation_config(const std::string& dir, const nlohmann::json& model_config) {
  const auto p = std::filesystem::path(dir) / "generation_config.json";
  if (std::filesystem::exists(p)) return parse_generation_config(read_json_file(p.string()), p.string());
  GenerationConfig g;
  const std::string cpath = (std::filesystem::path(dir) / "config.json").string();
  if (model_config.contains("eos_token_id"))
    g.eos_token_ids = int_or_list(model_config["eos_token_id"], cpath, "eos_token_id");
  return g;
}

}  // namespace dflash
