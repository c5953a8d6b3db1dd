// libFuzzer target over what `inspect` and every loader read before touching a weight: the
// safetensors header (parse_safetensors on bytes in memory) and config.json-like JSON
// (parse_qwen3_config, parse_rope and the RoPE table it gives, parse_generation_config). Any
// input must either parse into something whose invariants hold or fail with one one-line
// dflash::Error; nothing else may escape, and nothing may crash. The first byte picks the mode:
// configs come as bytes or as typed edits to a tiny target's config (json_edits.h), which reach
// the RoPE parameters' checks that raw bytes rarely do.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz_checks.h"
#include "io/checkpoint.h"
#include "json_edits.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/rope.h"
#include "util/error.h"

namespace {

using dflash::fuzz::check;
using dflash::fuzz::check_one_line;

void fuzz_header(const uint8_t* data, size_t size) {
  std::map<std::string, dflash::TensorInfo> tensors;
  try {
    tensors = dflash::parse_safetensors(data, size, "fuzz.safetensors");
  } catch (const dflash::Error& e) {
    check_one_line(e);
    return;
  }
  // Accepted: every tensor must lie inside the buffer and match its shape, so later code can
  // read it without further checks.
  for (const auto& [name, t] : tensors) {
    check(t.name == name, "tensor name differs from its key");
    check(t.data >= data && t.data <= data + size, "tensor data outside the file");
    check(t.nbytes <= size_t(data + size - t.data), "tensor bytes run past the end of the file");
    check(uint64_t(t.numel()) * dtype_size(t.dtype) == t.nbytes, "shape and byte count disagree");
    for (int64_t d : t.shape) check(d >= 0, "negative dimension accepted");
  }
}

void fuzz_config_json(const nlohmann::json& j) {
  const std::string path = "fuzz/config.json";
  try {
    const dflash::Qwen3Config c = dflash::parse_qwen3_config(j, path);
    check(c.vocab_size > 0 && c.hidden_size > 0 && c.num_hidden_layers > 0 && c.head_dim > 0, "non-positive size accepted");
    check(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0, "bad head grouping accepted");
    check(c.head_dim % 2 == 0, "odd head_dim accepted");
  } catch (const dflash::Error& e) {
    check_one_line(e);
  }
  try {
    // Accepted parameters must give finite frequencies, or be refused when the table is built.
    const dflash::RopeConfig r = dflash::parse_rope(j, 4096, path);
    const dflash::RopeTable table(r, 64, path);
    check(std::isfinite(table.attention_scaling()), "non-finite RoPE scaling accepted");
    for (float f : table.inv_freq()) check(std::isfinite(f), "non-finite RoPE frequency accepted");
  } catch (const dflash::Error& e) {
    check_one_line(e);
  }
  try {
    dflash::parse_generation_config(j, path);
  } catch (const dflash::Error& e) {
    check_one_line(e);
  }
}

void fuzz_config(const uint8_t* data, size_t size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {
    // Syntax errors and out-of-range numbers (1e400 throws out_of_range, not parse_error);
    // read_json_file turns both into a dflash::Error naming the file.
    return;
  }
  fuzz_config_json(j);
}

// The fields of a target's config.json and of its RoPE parameters in both layouts, for the
// edits of json_edits.h, and the tiny targets whose configs the edits start from (yarn, llama3
// and linear scaling).
const std::vector<std::string> kConfigFields = {
    "/rope_theta", "/rope_scaling", "/rope_scaling/rope_type", "/rope_scaling/type", "/rope_scaling/factor",
    "/rope_scaling/original_max_position_embeddings", "/rope_scaling/low_freq_factor",
    "/rope_scaling/high_freq_factor", "/rope_scaling/beta_fast", "/rope_scaling/beta_slow",
    "/rope_scaling/attention_factor", "/rope_scaling/mscale", "/rope_scaling/mscale_all_dim",
    "/rope_scaling/truncate", "/rope_parameters", "/rope_parameters/rope_theta", "/rope_parameters/factor",
    "/original_max_position_embeddings", "/max_position_embeddings", "/head_dim", "/hidden_size",
    "/num_attention_heads", "/num_key_value_heads", "/num_hidden_layers", "/intermediate_size", "/vocab_size",
    "/rms_norm_eps", "/tie_word_embeddings", "/use_sliding_window", "/architectures", "/eos_token_id",
    "/eos_token_id/0", "/bos_token_id", "/pad_token_id", "/temperature", "/top_p", "/top_k", "/do_sample"};

const nlohmann::json& tiny_config(int which) {
  static const nlohmann::json configs[3] = {
      dflash::read_json_file(DFLASH_SOURCE_DIR "/testdata/tiny/qwen3-yarn-bf16/config.json"),
      dflash::read_json_file(DFLASH_SOURCE_DIR "/testdata/tiny/qwen3-llama3rope-f32-sharded/config.json"),
      dflash::read_json_file(DFLASH_SOURCE_DIR "/testdata/tiny/qwen3-linear-f16-tied/config.json")};
  return configs[which % 3];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte: % 4 picks a header (0), a config's bytes (1) or edits to a tiny target's
  // config (2, 3; json_edits.h), / 4 which tiny config.
  const uint8_t mode = data[0] % 4;
  // A copy of exactly the payload, so that ASan sees any read past its end.
  std::string payload(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto* p = reinterpret_cast<const uint8_t*>(payload.data());
  if (mode == 0) {
    fuzz_header(p, payload.size());
  } else if (mode == 1) {
    fuzz_config(p, payload.size());
  } else {
    nlohmann::json j = tiny_config(data[0] / 4);
    dflash::fuzz::apply_json_edits(j, kConfigFields, p, payload.size());
    fuzz_config_json(j);
  }
  return 0;
}
