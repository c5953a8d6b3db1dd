// libFuzzer target over what `inspect` and every loader read before touching a weight: the
// safetensors header (parse_safetensors on bytes in memory) and config.json-like JSON
// (parse_qwen3_config, parse_rope and the RoPE table it gives, parse_generation_config). Any
// input must either parse into something whose invariants hold or fail with one one-line
// dflash::Error; nothing else may escape, and nothing may crash. The first byte picks the mode.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_checks.h"
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

void fuzz_config(const uint8_t* data, size_t size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {
    // Syntax errors and out-of-range numbers (1e400 throws out_of_range, not parse_error);
    // read_json_file turns both into a dflash::Error naming the file.
    return;
  }
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 2;
  // A copy of exactly the payload, so that ASan sees any read past its end.
  std::string payload(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto* p = reinterpret_cast<const uint8_t*>(payload.data());
  if (mode == 0) fuzz_header(p, payload.size());
  else fuzz_config(p, payload.size());
  return 0;
}
