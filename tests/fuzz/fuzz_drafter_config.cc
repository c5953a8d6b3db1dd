// libFuzzer target over what `inspect` and the drafter's loader make of a drafter's config.json
// beside its tensors: infer_drafter_config (the fields a publisher left out, filled from the
// shapes) and check_pairing against a tiny target. The config is either the input's bytes or
// the tiny drafter's own config with the input's edits (json_edits.h), which reach the type and
// range checks that raw bytes rarely do. Any config must either become a DrafterConfig whose
// pairing checks can be read, or fail with one one-line dflash::Error; nothing else may escape,
// and nothing may crash. A pair that passes every check must hold what the loader relies on.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>
#include <string>

#include "fuzz_checks.h"
#include "io/checkpoint.h"
#include "json_edits.h"
#include "io/config.h"
#include "model/dflash_drafter.h"
#include "util/error.h"

namespace {

namespace fs = std::filesystem;
using dflash::fuzz::check;
using dflash::fuzz::check_one_line;

// The tiny GQA-4 drafter's tensors, linked into a scratch directory whose config.json each
// input replaces.
const std::string& drafter_dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/fuzz_drafter_config.XXXXXX";
    check(mkdtemp(tmpl) != nullptr, "mkdtemp");
    const fs::path src = fs::path(DFLASH_SOURCE_DIR) / "testdata/tiny/dflash-qwen3-gqa4-untied-f32/model.safetensors";
    fs::create_symlink(src, fs::path(tmpl) / "model.safetensors");
    return std::string(tmpl);
  }();
  return dir;
}

const dflash::Qwen3Config& target() {
  static const dflash::Qwen3Config t = [] {
    const std::string path = std::string(DFLASH_SOURCE_DIR) + "/testdata/tiny/qwen3-gqa4-untied-f32/config.json";
    return dflash::parse_qwen3_config(dflash::read_json_file(path), path);
  }();
  return t;
}

void fuzz_config(const std::string& text, int token_count) {
  const std::string& dir = drafter_dir();
  {
    std::ofstream out(dir + "/config.json", std::ios::binary | std::ios::trunc);
    out.write(text.data(), std::streamsize(text.size()));
  }
  const dflash::Qwen3Config& t = target();
  try {
    dflash::Checkpoint ckpt = dflash::Checkpoint::open(dir);
    const dflash::DrafterConfig d = dflash::infer_drafter_config(ckpt, t, token_count);
    bool all_ok = true;
    for (const auto& c : dflash::check_pairing(d, ckpt, t, token_count)) {
      check(!c.what.empty(), "a pairing check without a name");
      all_ok = all_ok && c.ok;
    }
    if (!all_ok) return;
    check(d.layers.hidden_size == t.hidden_size, "hidden size mismatch passed");
    check(!d.target_layer_ids.empty(), "no target layers passed");
    std::set<int> seen;
    for (int id : d.target_layer_ids)
      check(id >= 0 && id < t.num_hidden_layers && seen.insert(id).second, "bad target layer id passed");
    check(d.block_size >= 2 && d.block_size <= 64, "bad block size passed");
    check(d.mask_token_id >= 0 && d.mask_token_id < t.vocab_size, "mask id outside the embedding passed");
    check(d.layers.num_attention_heads % d.layers.num_key_value_heads == 0, "bad head grouping passed");
  } catch (const dflash::Error& e) {
    check_one_line(e);
  }
}

// The fields a drafter config states, for the edits of json_edits.h.
const std::vector<std::string> kFields = {
    "/head_dim", "/hidden_size", "/num_hidden_layers", "/num_attention_heads", "/num_key_value_heads",
    "/intermediate_size", "/block_size", "/num_target_layers", "/dflash_config/mask_token_id",
    "/dflash_config/target_layer_ids", "/dflash_config/target_layer_ids/0", "/dflash_config/block_size",
    "/dflash_config", "/rope_theta", "/rope_scaling", "/rope_scaling/rope_type", "/rope_scaling/factor",
    "/layer_types", "/layer_types/0", "/vocab_size", "/max_position_embeddings", "/rms_norm_eps",
    "/tie_word_embeddings", "/use_sliding_window", "/architectures", "/dflash_guessed_fields"};

const nlohmann::json& tiny_config() {
  static const nlohmann::json c = dflash::read_json_file(std::string(DFLASH_SOURCE_DIR) +
                                                         "/testdata/tiny/dflash-qwen3-gqa4-untied-f32/config.json");
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte: bit 0, whether the target has a tokenizer defining ids 0 … 199 (so a missing
  // mask id can be derived, and 0 … 199 are refused as real tokens); bit 1, whether the rest is
  // the config's bytes or edits to the tiny drafter's config (json_edits.h).
  const int token_count = data[0] & 1 ? 200 : 0;
  if (data[0] & 2) {
    fuzz_config(std::string(reinterpret_cast<const char*>(data + 1), size - 1), token_count);
  } else {
    nlohmann::json doc = tiny_config();
    dflash::fuzz::apply_json_edits(doc, kFields, data + 1, size - 1);
    fuzz_config(doc.dump(), token_count);
  }
  return 0;
}
