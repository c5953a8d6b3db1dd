#include "model/inspect.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "io/checkpoint.h"
#include "model/dflash_drafter.h"
#include "util/error.h"

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

namespace dflash {

int64_t InspectTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const char* model_kind_name(ModelKind k) {
  switch (k) {
    case ModelKind::Qwen3Target: return "qwen3-target";
    case ModelKind::DFlashDrafter: return "dflash-drafter";
    case ModelKind::Unknown: return "unknown";
  }
  return "unknown";
}

const char* pairing_status_name(PairingLine::Status s) {
  switch (s) {
    case PairingLine::Status::Pass: return "PASS";
    case PairingLine::Status::Warn: return "WARN";
    case PairingLine::Status::Fail: return "FAIL";
  }
  return "FAIL";
}

std::string ShapeFinding::describe() const {
  switch (kind) {
    case Kind::Missing: return "missing tensor '" + name + "' (config implies " + shape_to_string(expected) + ")";
    case Kind::Mismatch:
      return "tensor '" + name + "' has shape " + shape_to_string(actual) + ", config implies " +
             shape_to_string(expected);
    case Kind::Unexpected:
      return "unexpected tensor '" + name + "' " + shape_to_string(actual) + " (not part of the architecture)";
  }
  return name;
}

namespace {

const char* kDrafterArch = "DFlashDraftModel";
const char* kQwen3Arch = "Qwen3ForCausalLM";

using ExpectedTensors = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// Publishers put the DFlash fields either in dflash_config or at the top level; the loader
// reads both (model/dflash_drafter.cc), so "stated" must mean the same here.
bool stated(const json& j, const char* name) {
  if (j.contains("dflash_config") && j["dflash_config"].is_object() && j["dflash_config"].contains(name) &&
      !j["dflash_config"][name].is_null())
    return true;
  return j.contains(name) && !j[name].is_null();
}

std::string with_commas(uint64_t v) {
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b >= (uint64_t(1) << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(uint64_t(1) << 30));
  else if (b >= (uint64_t(1) << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", double(b) / double(1 << 20));
  else if (b >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

std::string human_params(int64_t p) {
  char buf[32];
  if (p >= 1000000000) std::snprintf(buf, sizeof buf, "%.2f B", double(p) / 1e9);
  else if (p >= 1000000) std::snprintf(buf, sizeof buf, "%.2f M", double(p) / 1e6);
  else if (p >= 1000) std::snprintf(buf, sizeof buf, "%.1f K", double(p) / 1e3);
  else std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(p));
  return buf;
}


void add_decoder_layer(ExpectedTensors& out, const std::string& prefix, const Qwen3Config& c) {
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const int64_t q = int64_t(c.num_attention_heads) * D, kv = int64_t(c.num_key_value_heads) * D;
  out.push_back({prefix + "input_layernorm.weight", {H}});
  out.push_back({prefix + "post_attention_layernorm.weight", {H}});
  out.push_back({prefix + "self_attn.q_proj.weight", {q, H}});
  out.push_back({prefix + "self_attn.k_proj.weight", {kv, H}});
  out.push_back({prefix + "self_attn.v_proj.weight", {kv, H}});
  out.push_back({prefix + "self_attn.o_proj.weight", {H, q}});
  out.push_back({prefix + "self_attn.q_norm.weight", {D}});
  out.push_back({prefix + "self_attn.k_norm.weight", {D}});
  out.push_back({prefix + "mlp.gate_proj.weight", {I, H}});
  out.push_back({prefix + "mlp.up_proj.weight", {I, H}});
  out.push_back({prefix + "mlp.down_proj.weight", {H, I}});
}

// `optional` tensors may be present (then with the expected shape) or absent.
ConfigAgreement compare(const Checkpoint& ckpt, const ExpectedTensors& expected, const ExpectedTensors& optional = {}) {
  ConfigAgreement a;
  a.checked = true;
  a.expected_tensors = static_cast<int>(expected.size());
  std::set<std::string> known;
  for (const auto& [name, shape] : expected) {
    known.insert(name);
    if (!ckpt.has(name)) a.findings.push_back({ShapeFinding::Kind::Missing, name, shape, {}});
    else if (ckpt.peek(name).shape != shape)
      a.findings.push_back({ShapeFinding::Kind::Mismatch, name, shape, ckpt.peek(name).shape});
  }
  for (const auto& [name, shape] : optional) {
    known.insert(name);
    if (ckpt.has(name) && ckpt.peek(name).shape != shape)
      a.findings.push_back({ShapeFinding::Kind::Mismatch, name, shape, ckpt.peek(name).shape});
  }
  for (const auto& name : ckpt.names())
    if (!known.count(name)) a.findings.push_back({ShapeFinding::Kind::Unexpected, name, {}, ckpt.peek(name).shape});
  return a;
}

ConfigAgreement check_target(const Checkpoint& ckpt, const Qwen3Config& c) {
  const int64_t V = c.vocab_size, H = c.hidden_size;
  ExpectedTensors expected, optional;
  expected.push_back({"model.embed_tokens.weight", {V, H}});
  for (int i = 0; i < c.num_hidden_layers; ++i)
    add_decoder_layer(expected, "model.layers." + std::to_string(i) + ".", c);
  expected.push_back({"model.norm.weight", {H}});
  // Tied exports sometimes keep the copy; the loader accepts it if its shape is right.
  (c.tie_word_embeddings ? optional : expected).push_back({"lm_head.weight", {V, H}});
  return compare(ckpt, expected, optional);
}

// Everything the drafter inspection needs from a target, if there is one.
struct TargetInfo {
  bool present = false;
  std::string dir;
  Qwen3Config config;
  json config_json;
  int token_count = 0;
};

TargetInfo load_target_info(const std::string& dir) {
  TargetInfo t;
  t.present = true;
  t.dir = dir;
  Checkpoint ck = Checkpoint::open(dir);
  t.config_json = ck.config();
  t.config = parse_qwen3_config(ck.config(), ck.config_path());
  t.token_count = tokenizer_token_count(dir);
  return t;
}

// Without a target, the drafter's own config and hidden size stand in for it: enough for
// infer_drafter_config to run; fields that really come from the target are reported unknown.
Qwen3Config stand_in_target(const Checkpoint& ckpt) {
  const json& j = ckpt.config();
  const std::string path = ckpt.has_config() ? ckpt.config_path() : ckpt.dir() + " (no config.json)";
  Qwen3Config t;
  t.hidden_size = static_cast<int>(ckpt.peek("fc.weight").shape.at(0));
  t.vocab_size = json_int_or(j, "vocab_size", 2, path);
  t.max_position_embeddings = json_int_or(j, "max_position_embeddings", 1, path);
  t.rms_norm_eps = json_double_or(j, "rms_norm_eps", 1e-6, path);
  int layers = 0;
  if (j.contains("dflash_config") && j["dflash_config"].is_object())
    layers = json_int_or(j["dflash_config"], "num_target_layers", 0, path);
  if (!layers) layers = json_int_or(j, "num_target_layers", 0, path);
  t.num_hidden_layers = layers;
  if (j.contains("rope_theta") || j.contains("rope_parameters")) t.rope = parse_rope(j, t.max_position_embeddings, path);
  return t;
}

struct DrafterInference {
  DrafterConfig config;
  bool mask_known = true;
  std::set<std::string> guessed;     // field names infer_drafter_config filled
  std::set<std::string> from_option;  // field names the options set
};

DrafterInference infer_with_options(const Checkpoint& ckpt, const Qwen3Config& t, int token_count,
                                    const InspectOptions& opt) {
  DrafterInference r;
  int tc = token_count;
  const bool derivable = tc > 0 && tc < t.vocab_size;
  if (!stated(ckpt.config(), "mask_token_id") && !derivable) {
    // infer_drafter_config refuses a drafter whose mask id nothing determines; inspection
    // must still describe it, so let it derive a placeholder and report the field unknown.
    r.mask_known = false;
    tc = t.vocab_size - 1;
  }
  r.config = infer_drafter_config(ckpt, t, tc);
  for (const auto& g : r.config.guessed) r.guessed.insert(g.substr(0, g.find('=')));
  if (!r.mask_known) {
    r.config.mask_token_id = -1;
    r.guessed.erase("mask_token_id");
  }
  if (opt.mask_token_id) {
    r.config.mask_token_id = *opt.mask_token_id;
    r.mask_known = true;
    r.from_option.insert("mask_token_id");
  }
  if (opt.block_size) {
    r.config.block_size = *opt.block_size;
    r.from_option.insert("block_size");
  }
  if (opt.target_layer_ids) {
    r.config.target_layer_ids = *opt.target_layer_ids;
    r.from_option.insert("target_layer_ids");
  }
  for (const auto& f : r.from_option) r.guessed.erase(f);
  // Keep DrafterConfig::guessed consistent with what is reported.
  std::vector<std::string> kept;
  for (const auto& g : r.config.guessed)
    if (r.guessed.count(g.substr(0, g.find('=')))) kept.push_back(g);
  r.config.guessed = kept;
  return r;
}

const std::set<std::string> kShapeFields = {"hidden_size", "num_hidden_layers", "num_attention_heads",
                                            "num_key_value_heads", "head_dim", "intermediate_size"};
const std::set<std::string> kTargetFields = {"vocab_size", "max_position_embeddings", "num_target_layers"};

std::vector<DrafterField> drafter_fields(const DrafterInference& inf, bool have_target) {
  const DrafterConfig& d = inf.config;
  const Qwen3Config& c = d.layers;
  std::vector<DrafterField> out;
  auto add = [&](const std::string& name, json value) {
    DrafterField f{name, std::move(value), "config.json", ""};
    if (inf.from_option.count(name)) {
      f.source = "option";
    } else if (inf.guessed.count(name)) {
      if (kShapeFields.count(name)) {
        f.source = "shapes";
      } else if (kTargetFields.count(name)) {
        f.source = have_target ? "target" : "unknown";
        if (!have_target) {
          f.value = nullptr;
          f.note = "the target's (pass --target)";
        }
      } else if (name == "rms_norm_eps") {
        f.source = have_target ? "target" : "default";
        f.note = "shapes cannot tell; assumed equal to the target's";
      } else {
        f.source = "default";
      }
    }
    out.push_back(std::move(f));
  };
  add("hidden_size", c.hidden_size);
  add("num_hidden_layers", c.num_hidden_layers);
  add("num_attention_heads", c.num_attention_heads);
  add("num_key_value_heads", c.num_key_value_heads);
  add("head_dim", c.head_dim);
  add("intermediate_size", c.intermediate_size);
  add("rms_norm_eps", c.rms_norm_eps);
  add("vocab_size", c.vocab_size);
  add("max_position_embeddings", c.max_position_embeddings);
  add("num_target_layers", d.num_target_layers);
  const bool layers_known = have_target || !inf.guessed.count("num_target_layers");
  add("target_layer_ids", d.target_layer_ids);
  if (out.back().source == "default") {
    if (layers_known) {
      out.back().note = "publisher default for K target layers (contract section 3); the real ids are not recorded in the weights";
    } else {
      out.back().value = nullptr;
      out.back().source = "unknown";
      out.back().note = "default round(1 + i*(L-4)/(K-1)) needs L, the target's layer count (pass --target)";
    }
  }
  add("block_size", d.block_size);
  if (out.back().source == "default") out.back().note = "the usual DFlash block";
  add("mask_token_id", d.mask_token_id);
  if (!inf.mask_known) {
    out.back().value = nullptr;
    out.back().source = "unknown";
    out.back().note = "default: the first embedding row past the target tokenizer's last id; needs a target with "
                      "tokenizer.json (or --mask-token-id)";
  } else if (out.back().source == "default") {
    out.back().note = "the first embedding row past the target tokenizer's last id";
  }
  return out;
}

void inspect_drafter(const Checkpoint& ckpt, const TargetInfo& target, const InspectOptions& opt, InspectReport& r) {
  DrafterInspection di;
  di.target_dir = target.present ? target.dir : "";
  const json& j = ckpt.config();
  if (j.contains("dflash_guessed_fields") && j["dflash_guessed_fields"].is_array())
    for (const auto& f : j["dflash_guessed_fields"])
      if (f.is_string()) di.config_guessed_fields.push_back(f.get<std::string>());
  try {
    if (!ckpt.has("fc.weight")) throw Error(ckpt.dir() + ": missing tensor 'fc.weight' (not a DFlash drafter?)");
    const auto& fc = ckpt.peek("fc.weight");
    if (fc.shape.size() != 2) throw Error(fc.file + ": tensor 'fc.weight' must be 2-D, has shape " + fc.shape_str());
    di.fc_rows = fc.shape[0];
    di.fc_cols = fc.shape[1];
    di.target_hidden = target.present ? target.config.hidden_size : di.fc_rows;
    di.k = di.target_hidden > 0 && di.fc_cols % di.target_hidden == 0 ? static_cast<int>(di.fc_cols / di.target_hidden) : 0;
    di.k_note = "fc.weight " + fc.shape_str() + ": " + std::to_string(di.fc_cols) + " input columns / " +
                (target.present ? "target hidden size " : "ASSUMED target hidden size = drafter hidden size ") +
                std::to_string(di.target_hidden) +
                (di.k ? " = " + std::to_string(di.k) + " target layers" : ": does not divide") +
                (target.present ? "" : " (pass --target for the real K)");

    const Qwen3Config t = target.present ? target.config : stand_in_target(ckpt);
    DrafterInference inf = infer_with_options(ckpt, t, target.present ? target.token_count : 0, opt);
    di.config = inf.config;
    di.config_valid = true;
    di.fields = drafter_fields(inf, target.present);

    const Qwen3Config& c = inf.config.layers;
    const int64_t H = c.hidden_size;
    // fc's input width depends on the target (K x its hidden size): that is a pairing check,
    // so the drafter alone is held only to fc's rows.
    ExpectedTensors expected;
    expected.push_back({"fc.weight", {H, di.fc_cols}});
    expected.push_back({"hidden_norm.weight", {H}});
    for (int i = 0; i < c.num_hidden_layers; ++i) add_decoder_layer(expected, "layers." + std::to_string(i) + ".", c);
    expected.push_back({"norm.weight", {H}});
    r.agreement = compare(ckpt, expected);
    if (!ckpt.has_config()) r.agreement.note = "no config.json: the config above is inferred, so it agrees by construction";
  } catch (const Error& e) {
    r.agreement.checked = true;
    r.agreement.error = e.what();
  } catch (const nlohmann::json::exception& e) {
    // A field of the wrong JSON type deep in the drafter config.
    r.agreement.checked = true;
    r.agreement.error = ckpt.config_path() + ": " + e.what();
  }
  r.drafter = std::move(di);
}

InspectReport inspect_opened(const Checkpoint& ckpt, const TargetInfo& target, const InspectOptions& opt) {
  InspectReport r;
  r.dir = ckpt.dir();
  r.has_config = ckpt.has_config();
  const json& j = ckpt.config();
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    r.architecture = j["architectures"][0].get<std::string>();

  std::set<std::string> files;
  std::map<DType, InspectDtype> dtypes;
  for (const auto& name : ckpt.names()) {
    const TensorInfo& t = ckpt.peek(name);
    InspectTensor it{name, fs::path(t.file).filename().string(), t.dtype, t.shape, t.nbytes};
    files.insert(it.file);
    auto& d = dtypes[t.dtype];
    d.dtype = t.dtype;
    d.tensors += 1;
    d.parameters += it.numel();
    d.bytes += it.bytes;
    r.parameters += it.numel();
    r.bytes += it.bytes;
    r.tensors.push_back(std::move(it));
  }
  r.files.assign(files.begin(), files.end());
  for (const auto& [_, d] : dtypes) r.dtypes.push_back(d);

  if (ckpt.has("fc.weight") || r.architecture == kDrafterArch) {
    r.kind = ModelKind::DFlashDrafter;
    if (r.architecture.empty()) r.architecture = std::string(kDrafterArch) + " (inferred: fc.weight present)";
    inspect_drafter(ckpt, target, opt, r);
  } else if ((r.architecture.empty() && ckpt.has("model.embed_tokens.weight")) || r.architecture == kQwen3Arch) {
    r.kind = ModelKind::Qwen3Target;
    if (r.architecture.empty()) r.architecture = std::string(kQwen3Arch) + " (inferred: model.embed_tokens.weight present)";
    if (!ckpt.has_config()) {
      r.agreement.note = "no config.json";
      r.agreement.error = ckpt.config_path() + ": missing (a target needs config.json)";
    } else {
      try {
        r.target_config = parse_qwen3_config(j, ckpt.config_path());
        r.agreement = check_target(ckpt, *r.target_config);
      } catch (const Error& e) {
        r.agreement.checked = true;
        r.agreement.error = e.what();
      } catch (const nlohmann::json::exception& e) {
        r.agreement.checked = true;
        r.agreement.error = ckpt.config_path() + ": " + e.what();
      }
    }
  } else {
    r.agreement.note = "architecture " + (r.architecture.empty() ? std::string("not stated") : r.architecture) +
                       ": shapes are checked for Qwen3ForCausalLM targets and DFlashDraftModel drafters only";
  }
  return r;
}

ordered_json findings_json(const ConfigAgreement& a) {
  ordered_json out;
  out["ok"] = a.ok();
  out["checked"] = a.checked;
  if (!a.error.empty()) out["error"] = a.error;
  if (!a.note.empty()) out["note"] = a.note;
  out["expected_tensors"] = a.expected_tensors;
  out["findings"] = ordered_json::array();
  for (const auto& f : a.findings) {
    ordered_json o;
    o["kind"] = f.kind == ShapeFinding::Kind::Missing ? "missing" : f.kind == ShapeFinding::Kind::Mismatch ? "mismatch" : "unexpected";
    o["name"] = f.name;
    if (f.kind != ShapeFinding::Kind::Unexpected) o["expected"] = f.expected;
    if (f.kind != ShapeFinding::Kind::Missing) o["actual"] = f.actual;
    o["message"] = f.describe();
    out["findings"].push_back(o);
  }
  return out;
}

ordered_json qwen3_config_json(const Qwen3Config& c) {
  ordered_json o;
  o["num_hidden_layers"] = c.num_hidden_layers;
  o["hidden_size"] = c.hidden_size;
  o["num_attention_heads"] = c.num_attention_heads;
  o["num_key_value_heads"] = c.num_key_value_heads;
  o["head_dim"] = c.head_dim;
  o["intermediate_size"] = c.intermediate_size;
  o["vocab_size"] = c.vocab_size;
  o["max_position_embeddings"] = c.max_position_embeddings;
  o["rms_norm_eps"] = c.rms_norm_eps;
  o["tie_word_embeddings"] = c.tie_word_embeddings;
  o["rope"] = c.rope.describe();
  return o;
}

std::string agreement_text(const ConfigAgreement& a) {
  std::ostringstream s;
  if (!a.error.empty()) {
    s << "config agreement: FAIL: " << a.error << "\n";
  } else if (!a.checked) {
    s << "config agreement: not checked (" << a.note << ")\n";
  } else if (a.findings.empty()) {
    s << "config agreement: OK (" << a.expected_tensors << " expected tensors, all present with the expected shapes, none unexpected)";
    if (!a.note.empty()) s << "; " << a.note;
    s << "\n";
  } else {
    s << "config agreement: FAIL (" << a.findings.size() << " disagreement" << (a.findings.size() > 1 ? "s" : "") << ")\n";
    for (const auto& f : a.findings) s << "  " << f.describe() << "\n";
  }
  return s.str();
}

}  // namespace

InspectReport inspect_checkpoint(const std::string& dir, const InspectOptions& opt) {
  Checkpoint ckpt = Checkpoint::open(dir, /*require_config=*/false);
  TargetInfo target;
  const bool drafter = ckpt.has("fc.weight");
  if (!opt.target_dir.empty() && drafter) target = load_target_info(opt.target_dir);
  return inspect_opened(ckpt, target, opt);
}

nlohmann::ordered_json InspectReport::to_json(bool with_tensors) const {
  ordered_json o;
  o["dir"] = dir;
  o["kind"] = model_kind_name(kind);
  o["architecture"] = architecture;
  o["has_config"] = has_config;
  o["files"] = files;
  o["tensor_count"] = tensors.size();
  o["parameters"] = parameters;
  o["bytes"] = bytes;
  o["dtypes"] = ordered_json::array();
  for (const auto& d : dtypes)
    o["dtypes"].push_back({{"dtype", dtype_name(d.dtype)}, {"tensors", d.tensors}, {"parameters", d.parameters}, {"bytes", d.bytes}});
  if (target_config) o["config"] = qwen3_config_json(*target_config);
  if (drafter) {
    ordered_json d;
    d["target"] = drafter->target_dir.empty() ? ordered_json(nullptr) : ordered_json(drafter->target_dir);
    d["fc_shape"] = {drafter->fc_rows, drafter->fc_cols};
    d["target_hidden_size"] = drafter->target_hidden;
    d["target_hidden_size_assumed"] = drafter->target_dir.empty();
    d["k"] = drafter->k;
    d["k_note"] = drafter->k_note;
    d["fields"] = ordered_json::object();
    for (const auto& f : drafter->fields) {
      ordered_json fj;
      fj["value"] = f.value;
      fj["source"] = f.source;
      if (!f.note.empty()) fj["note"] = f.note;
      d["fields"][f.name] = fj;
    }
    d["config_guessed_fields"] = drafter->config_guessed_fields;
    o["drafter"] = d;
  }
  o["config_agreement"] = findings_json(agreement);
  o["ok"] = ok();
  if (with_tensors) {
    o["tensors"] = ordered_json::array();
    for (const auto& t : tensors)
      o["tensors"].push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", dtype_name(t.dtype)}, {"bytes", t.bytes}, {"file", t.file}});
  }
  return o;
}

std::string InspectReport::to_text(bool with_tensors) const {
  std::ostringstream s;
  s << dir << "\n";
  const char* kind_text = kind == ModelKind::Qwen3Target ? "Qwen3 target" : kind == ModelKind::DFlashDrafter ? "DFlash drafter" : "unknown";
  s << "  kind:         " << kind_text << " (architecture " << (architecture.empty() ? "not stated" : architecture) << ")"
    << (has_config ? "" : ", no config.json") << "\n";
  s << "  files:        ";
  for (size_t i = 0; i < files.size(); ++i) s << (i ? ", " : "") << files[i];
  s << "\n  parameters:   " << with_commas(uint64_t(parameters)) << " (" << human_params(parameters) << ") in "
    << tensors.size() << " tensors, " << with_commas(bytes) << " bytes (" << human_bytes(bytes) << ")\n";
  s << "  dtypes:       ";
  for (size_t i = 0; i < dtypes.size(); ++i)
    s << (i ? "; " : "") << dtype_name(dtypes[i].dtype) << " " << dtypes[i].tensors << " tensors, "
      << with_commas(uint64_t(dtypes[i].parameters)) << " parameters";
  s << "\n";
  if (target_config) {
    const auto& c = *target_config;
    s << "  config:       " << c.num_hidden_layers << " layers, hidden " << c.hidden_size << ", " << c.num_attention_heads
      << " heads, " << c.num_key_value_heads << " KV heads, head_dim " << c.head_dim << ", intermediate "
      << c.intermediate_size << ", vocab " << c.vocab_size << ", " << (c.tie_word_embeddings ? "tied" : "untied")
      << " LM head, max positions " << c.max_position_embeddings << ", RoPE " << c.rope.describe() << "\n";
  }
  if (drafter) {
    const auto& d = *drafter;
    s << "  target:       " << (d.target_dir.empty() ? "none given (fields that come from the target are unknown)" : d.target_dir) << "\n";
    s << "  K:            " << (d.k ? std::to_string(d.k) : std::string("?")) << " (" << d.k_note << ")\n";
    if (!d.fields.empty()) {
      s << "  drafter config (value, source):\n";
      for (const auto& f : d.fields) {
        char line[96];
        const std::string v = f.value.is_null() ? "?" : f.value.dump();
        std::snprintf(line, sizeof line, "    %-24s %-14s %s", f.name.c_str(), v.c_str(), f.source.c_str());
        s << line;
        if (!f.note.empty()) s << " (" << f.note << ")";
        s << "\n";
      }
    }
    if (!d.config_guessed_fields.empty()) {
      s << "  config.json marks as guessed:";
      for (const auto& f : d.config_guessed_fields) s << " " << f;
      s << "\n";
    }
  }
  s << agreement_text(agreement);
  if (with_tensors) {
    size_t w = 4;
    for (const auto& t : tensors) w = std::max(w, t.name.size());
    const bool many_files = files.size() > 1;
    char line[64];
    s << "tensors:\n  " << std::string("name") << std::string(w - 4 + 2, ' ');
    std::snprintf(line, sizeof line, "%-18s %-5s %14s", "shape", "dtype", "bytes");
    s << line << (many_files ? "  file" : "") << "\n";
    for (const auto& t : tensors) {
      s << "  " << t.name << std::string(w - t.name.size() + 2, ' ');
      std::snprintf(line, sizeof line, "%-18s %-5s %14s", shape_to_string(t.shape).c_str(), dtype_name(t.dtype),
                    with_commas(t.bytes).c_str());
      s << line;
      if (many_files) s << "  " << t.file;
      s << "\n";
    }
  }
  return s.str();
}

// --- pairing ------------------------------------------------------------------------------

bool PairingReport::ok() const {
  for (const auto& l : lines)
    if (l.status == PairingLine::Status::Fail) return false;
  return !lines.empty();
}

nlohmann::ordered_json PairingReport::to_json() const {
  ordered_json o;
  o["draft"] = draft_dir;
  o["target"] = target_dir;
  o["ok"] = ok();
  o["checks"] = ordered_json::array();
  for (const auto& l : lines)
    o["checks"].push_back({{"what", l.what}, {"status", pairing_status_name(l.status)}, {"detail", l.detail}});
  return o;
}

std::string PairingReport::to_text() const {
  std::ostringstream s;
  s << "pairing: drafter " << draft_dir << " with target " << target_dir << "\n";
  int fails = 0, warns = 0;
  for (const auto& l : lines) {
    s << "  " << pairing_status_name(l.status) << "  " << l.what << ": " << l.detail << "\n";
    fails += l.status == PairingLine::Status::Fail;
    warns += l.status == PairingLine::Status::Warn;
  }
  if (fails) s << "result: FAIL (" << fails << " of " << lines.size() << " checks failed)\n";
  else s << "result: PASS (" << lines.size() << " checks" << (warns ? ", " + std::to_string(warns) + " warnings" : "") << ")\n";
  return s.str();
}

namespace {

std::string agreement_summary(const InspectReport& r) {
  if (!r.agreement.error.empty()) return r.agreement.error;
  if (!r.agreement.checked) return r.agreement.note;
  if (r.agreement.findings.empty())
    return "config agrees with the tensors (" + std::to_string(r.agreement.expected_tensors) + " expected, all present)";
  std::string s = std::to_string(r.agreement.findings.size()) + " disagreement(s): " + r.agreement.findings[0].describe();
  if (r.agreement.findings.size() > 1) s += "; …";
  return s;
}

// Appends without building `sep + item` temporaries: GCC 12 flags those with a false -Wrestrict.
void append_item(std::string& list, const std::string& item, const char* sep) {
  if (!list.empty()) list += sep;
  list += item;
}

std::string dtype_list(const InspectReport& r) {
  std::string s;
  for (const auto& d : r.dtypes) append_item(s, dtype_name(d.dtype), "+");
  return s.empty() ? "none" : s;
}

}  // namespace

PairingReport inspect_pairing(const std::string& draft_dir, const std::string& target_dir, const InspectOptions& opt) {
  using S = PairingLine::Status;
  PairingReport rep;
  rep.draft_dir = draft_dir;
  rep.target_dir = target_dir;
  auto add = [&](std::string what, S s, std::string detail) { rep.lines.push_back({std::move(what), s, std::move(detail)}); };

  TargetInfo target;
  InspectReport tr;
  try {
    Checkpoint tck = Checkpoint::open(target_dir, /*require_config=*/false);
    tr = inspect_opened(tck, TargetInfo{}, {});
  } catch (const Error& e) {
    add("target checkpoint", S::Fail, e.what());
    return rep;
  }
  const bool target_ok = tr.kind == ModelKind::Qwen3Target && tr.agreement.ok();
  add("target checkpoint", target_ok ? S::Pass : S::Fail,
      tr.kind != ModelKind::Qwen3Target ? "not a Qwen3 target (architecture " + tr.architecture + ")"
                                        : tr.architecture + ", " + agreement_summary(tr));
  if (!tr.target_config) return rep;
  target.present = true;
  target.dir = target_dir;
  target.config = *tr.target_config;
  try {
    target.token_count = tokenizer_token_count(target_dir);
  } catch (const Error& e) {
    add("target tokenizer", S::Fail, e.what());
  }

  std::optional<Checkpoint> dck;
  try {
    dck.emplace(Checkpoint::open(draft_dir, /*require_config=*/false));
  } catch (const Error& e) {
    add("drafter checkpoint", S::Fail, e.what());
    return rep;
  }
  const InspectReport dr = inspect_opened(*dck, target, opt);
  if (dr.kind != ModelKind::DFlashDrafter) {
    add("drafter checkpoint", S::Fail, "not a DFlash drafter (no fc.weight; architecture " + dr.architecture + ")");
    return rep;
  }
  add("drafter checkpoint", dr.agreement.ok() ? S::Pass : S::Fail, agreement_summary(dr));
  if (!dr.drafter || !dr.drafter->config_valid) return rep;
  const DrafterInspection& di = *dr.drafter;

  // Fields nobody stated: a guessed target_layer_ids or mask id is the classic silent failure
  // (contract section 7), so it warns even when every check below passes.
  std::string guessed, filled;
  bool mask_unknown = false;
  for (const auto& f : di.fields) {
    const std::string v = f.name + "=" + (f.value.is_null() ? "?" : f.value.dump());
    if (f.source == "default") append_item(guessed, v, ", ");
    else if (f.source == "shapes" || f.source == "target") append_item(filled, v, ", ");
    if (f.name == "mask_token_id" && f.source == "unknown") mask_unknown = true;
  }
  for (const auto& f : di.config_guessed_fields) append_item(guessed, f + " (marked guessed in config.json)", ", ");
  if (mask_unknown)
    add("drafter config", S::Fail, "mask_token_id is not stated and cannot be derived (the target has no tokenizer.json "
                                   "with fewer ids than its embedding rows); pass --mask-token-id");
  else if (!guessed.empty())
    add("drafter config", S::Warn, "guessed, not stated: " + guessed + (filled.empty() ? "" : "; filled from shapes/target: " + filled));
  else
    add("drafter config", S::Pass, filled.empty() ? "every field stated" : "stated, or filled from shapes/target: " + filled);

  for (const auto& c : check_pairing(di.config, *dck, target.config, target.token_count))
    add(c.what, c.ok ? S::Pass : S::Fail, c.detail);

  // Both sides in one format is what the pair was trained and exported as; F16 against BF16
  // means one of them was converted, and F16 cannot hold BF16's range.
  const std::string dd = dtype_list(dr), td = dtype_list(tr);
  const bool f16_vs_bf16 = (dd.find("BF16") != std::string::npos && td.find("F16") != std::string::npos && td.find("BF16") == std::string::npos) ||
                           (td.find("BF16") != std::string::npos && dd.find("F16") != std::string::npos && dd.find("BF16") == std::string::npos);
  add("dtypes", f16_vs_bf16 ? S::Warn : S::Pass,
      "drafter " + dd + ", target " + td + (dd == td ? "" : (f16_vs_bf16 ? " (F16 against BF16: one side was converted)" : " (different, each kept as stored)")));
  return rep;
}

// --- --write-config -----------------------------------------------------------------------

nlohmann::ordered_json drafter_config_json(const std::string& draft_dir, const InspectOptions& opt) {
  if (opt.target_dir.empty())
    throw Error(draft_dir + ": writing a drafter config needs its target (--target): vocabulary, RoPE, layer count "
                "and the mask id come from it");
  const TargetInfo target = load_target_info(opt.target_dir);
  const Checkpoint ckpt = Checkpoint::open(draft_dir, /*require_config=*/false);
  const DrafterInference inf = infer_with_options(ckpt, target.config, target.token_count, opt);
  if (!inf.mask_known)
    throw Error(draft_dir + ": field 'mask_token_id' is not stated and cannot be derived (the target " + opt.target_dir +
                " has no tokenizer.json with fewer ids than its embedding rows); pass --mask-token-id");
  const DrafterConfig& d = inf.config;
  const Qwen3Config& c = d.layers;
  const auto fields = drafter_fields(inf, true);

  // Start from whatever the publisher did state, so nothing they said is lost.
  ordered_json out = ordered_json::object();
  const json& stated_cfg = ckpt.config();
  out["architectures"] = {kDrafterArch};
  out["model_type"] = "qwen3";
  out["hidden_size"] = c.hidden_size;
  out["intermediate_size"] = c.intermediate_size;
  out["num_hidden_layers"] = c.num_hidden_layers;
  out["num_attention_heads"] = c.num_attention_heads;
  out["num_key_value_heads"] = c.num_key_value_heads;
  out["head_dim"] = c.head_dim;
  out["hidden_act"] = "silu";
  out["attention_bias"] = false;
  out["rms_norm_eps"] = c.rms_norm_eps;
  out["vocab_size"] = c.vocab_size;
  out["max_position_embeddings"] = c.max_position_embeddings;
  out["tie_word_embeddings"] = false;
  // The drafter rotates with the target's RoPE; copying the target's own fields keeps every
  // scaling parameter exactly as the target states it.
  const json& rope_src = stated_cfg.contains("rope_theta") || stated_cfg.contains("rope_parameters") ? stated_cfg : target.config_json;
  for (const char* k : {"rope_theta", "rope_scaling", "rope_parameters"})
    if (rope_src.contains(k)) out[k] = rope_src[k];
  for (auto it = stated_cfg.begin(); it != stated_cfg.end(); ++it)
    if (!out.contains(it.key())) out[it.key()] = it.value();
  // One place for the DFlash fields: the loader prefers dflash_config, so a stale top-level copy
  // would only mislead a reader.
  out.erase("mask_token_id");
  out.erase("target_layer_ids");
  out["block_size"] = d.block_size;
  out["num_target_layers"] = d.num_target_layers;
  ordered_json dc = out.contains("dflash_config") && out["dflash_config"].is_object() ? out["dflash_config"] : ordered_json::object();
  dc["mask_token_id"] = d.mask_token_id;
  dc["target_layer_ids"] = d.target_layer_ids;
  dc.erase("block_size");
  dc.erase("num_target_layers");
  out["dflash_config"] = dc;

  std::vector<std::string> guessed;
  ordered_json inferred = ordered_json::object();
  for (const auto& f : fields) {
    if (f.source == "default" || (f.name == "rms_norm_eps" && f.source == "target")) guessed.push_back(f.name);
    else if (f.source == "shapes" || f.source == "target" || f.source == "option") inferred[f.name] = f.source;
  }
  if (!stated_cfg.contains("rope_theta") && !stated_cfg.contains("rope_parameters")) inferred["rope"] = "target";
  out["dflash_guessed_fields"] = guessed;
  out["dflash_inferred_fields"] = inferred;
  out["dflash_written_by"] = "dflash inspect --write-config";
  return out;
}

void write_drafter_config(const std::string& draft_dir, const InspectOptions& opt, const std::string& out_path) {
  const ordered_json j = drafter_config_json(draft_dir, opt);
  std::ofstream out(out_path, std::ios::binary);
  if (!out) throw Error(out_path + ": cannot write");
  out << j.dump(2) << "\n";
  if (!out) throw Error(out_path + ": write failed");
}

}  // namespace dflash
