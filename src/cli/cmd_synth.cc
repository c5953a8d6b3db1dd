// dflash synth: random-weight checkpoints of real model shapes, for benchmarks where only
// the shapes matter (a Qwen3-8B-shaped target and its DFlash drafter, say). Written in the
// Hugging Face layout, so transformers loads the very same weights.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

#include "cli/command.h"
#include "util/dtype.h"
#include "util/error.h"

namespace dflash::cli {
namespace {

struct Shape {
  int vocab, hidden, layers, heads, kv_heads, head_dim, intermediate;
  bool tied;
  int max_positions;
  double rope_theta;
};

const std::map<std::string, Shape> kTargets = {
    {"qwen3-0.6b", {151936, 1024, 28, 16, 8, 128, 3072, true, 40960, 1000000.0}},
    {"qwen3-8b", {151936, 4096, 36, 32, 8, 128, 12288, false, 40960, 1000000.0}},
};

struct Writer {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
  std::vector<float> fill;  // per tensor: std (0 = ones, for norms)
  void add(const std::string& name, std::vector<int64_t> shape, float stddev) {
    tensors.emplace_back(name, std::move(shape));
    fill.push_back(stddev);
  }
  void write(const std::string& path, uint64_t seed) {
    uint64_t offset = 0;
    for (const auto& [name, shape] : tensors) {
      uint64_t n = 2;
      for (auto d : shape) n *= uint64_t(d);
      header[name] = {{"dtype", "BF16"}, {"shape", shape}, {"data_offsets", {offset, offset + n}}};
      offset += n;
    }
    std::string h = header.dump();
    h.append((8 - h.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
    std::ofstream out(path, std::ios::binary);
    if (!out) throw Error(path + ": cannot write");
    const uint64_t hl = h.size();
    out.write(reinterpret_cast<const char*>(&hl), 8);
    out.write(h.data(), std::streamsize(h.size()));
    std::vector<uint16_t> buf;
    for (size_t t = 0; t < tensors.size(); ++t) {
      uint64_t n = 1;
      for (auto d : tensors[t].second) n *= uint64_t(d);
      buf.resize(n);
      if (fill[t] == 0) std::fill(buf.begin(), buf.end(), f32_to_bf16(1.0f));
      else fill_uniform(buf, fill[t], seed * 1000003ULL + t);
      out.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(n * 2));
    }
    if (!out) throw Error(path + ": write failed");
  }

  // Uniform with standard deviation `stddev` (cheap, and nothing here needs a Gaussian), on
  // every core: an 8B checkpoint is 9 G values, most of a benchmark call's setup when drawn on
  // one. Chunks of 1 Mi values each draw from their own stream (stream, chunk), so the bytes do
  // not depend on the number of threads.
  static void fill_uniform(std::vector<uint16_t>& buf, float stddev, uint64_t stream) {
    constexpr size_t kChunk = size_t(1) << 20;
    const size_t chunks = (buf.size() + kChunk - 1) / kChunk;
    const float a = stddev * std::sqrt(3.0f);
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t c = next++; c < chunks; c = next++) {
        std::mt19937_64 rng(stream * 0x9e3779b97f4a7c15ULL + c);
        const size_t end = std::min(buf.size(), (c + 1) * kChunk);
        for (size_t i = c * kChunk; i < end; ++i)
          buf[i] = f32_to_bf16(a * (2.0f * float(rng() >> 40) / float(1 << 24) - 1.0f));
      }
    };
    const size_t threads = std::min<size_t>(chunks, std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (size_t i = 1; i < threads; ++i) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
  }
};

void add_layer(Writer& w, const std::string& p, const Shape& s) {
  const int64_t H = s.hidden, D = s.head_dim, I = s.intermediate;
  w.add(p + "input_layernorm.weight", {H}, 0);
  w.add(p + "self_attn.q_proj.weight", {s.heads * D, H}, 0.02f);
  w.add(p + "self_attn.k_proj.weight", {s.kv_heads * D, H}, 0.02f);
  w.add(p + "self_attn.v_proj.weight", {s.kv_heads * D, H}, 0.02f);
  w.add(p + "self_attn.o_proj.weight", {H, s.heads * D}, 0.02f);
  w.add(p + "self_attn.q_norm.weight", {D}, 0);
  w.add(p + "self_attn.k_norm.weight", {D}, 0);
  w.add(p + "post_attention_layernorm.weight", {H}, 0);
  w.add(p + "mlp.gate_proj.weight", {I, H}, 0.02f);
  w.add(p + "mlp.up_proj.weight", {I, H}, 0.02f);
  w.add(p + "mlp.down_proj.weight", {H, I}, 0.02f);
}

nlohmann::ordered_json qwen3_config(const Shape& s, int layers) {
  return {{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"vocab_size", s.vocab},
          {"hidden_size", s.hidden}, {"intermediate_size", s.intermediate}, {"num_hidden_layers", layers},
          {"num_attention_heads", s.heads}, {"num_key_value_heads", s.kv_heads}, {"head_dim", s.head_dim},
          {"hidden_act", "silu"}, {"rms_norm_eps", 1e-6}, {"rope_theta", s.rope_theta}, {"rope_scaling", nullptr},
          {"max_position_embeddings", s.max_positions}, {"tie_word_embeddings", s.tied}, {"torch_dtype", "bfloat16"},
          {"attention_bias", false}, {"use_sliding_window", false}, {"bos_token_id", 151643}, {"eos_token_id", 151645}};
}

void write_json(const std::string& path, const nlohmann::ordered_json& j) {
  std::ofstream(path) << j.dump(2) << "\n";
}

int run_synth(const std::string& preset, const std::string& out, const std::string& draft_out, int draft_layers,
              uint64_t seed) {
  auto it = kTargets.find(preset);
  if (it == kTargets.end()) throw Error("unknown --preset '" + preset + "' (qwen3-0.6b, qwen3-8b)");
  const Shape& s = it->second;
  std::filesystem::create_directories(out);
  Writer w;
  w.add("model.embed_tokens.weight", {s.vocab, s.hidden}, 0.02f);
  for (int i = 0; i < s.layers; ++i) add_layer(w, "model.layers." + std::to_string(i) + ".", s);
  w.add("model.norm.weight", {s.hidden}, 0);
  if (!s.tied) w.add("lm_head.weight", {s.vocab, s.hidden}, 0.02f);
  w.write(out + "/model.safetensors", seed);
  write_json(out + "/config.json", qwen3_config(s, s.layers));
  write_json(out + "/generation_config.json", {{"eos_token_id", {151645, 151643}}, {"bos_token_id", 151643}});
  std::printf("wrote %s (%s, random bf16 weights)\n", out.c_str(), preset.c_str());
  if (draft_out.empty()) return 0;
  // The public drafter's layout for this target: five target layers by the publisher's rule.
  std::filesystem::create_directories(draft_out);
  const int K = 5;
  std::vector<int> ids;
  for (int i = 0; i < K; ++i) ids.push_back(int(std::nearbyint(1.0 + i * double(s.layers - 4) / (K - 1))));
  Writer d;
  d.add("fc.weight", {s.hidden, int64_t(K) * s.hidden}, 0.02f);
  d.add("hidden_norm.weight", {s.hidden}, 0);
  for (int i = 0; i < draft_layers; ++i) add_layer(d, "layers." + std::to_string(i) + ".", s);
  d.add("norm.weight", {s.hidden}, 0);
  d.write(draft_out + "/model.safetensors", seed + 1);
  auto cfg = qwen3_config(s, draft_layers);
  cfg["architectures"] = {"DFlashDraftModel"};
  cfg["block_size"] = 16;
  cfg["num_target_layers"] = s.layers;
  cfg["dflash_config"] = {{"mask_token_id", 151669}, {"target_layer_ids", ids}};
  write_json(draft_out + "/config.json", cfg);
  std::printf("wrote %s (%d-layer DFlash drafter)\n", draft_out.c_str(), draft_layers);
  return 0;
}

RegisterCommand reg("synth", "Write a random-weight checkpoint of a real model shape (for benchmarks)",
                    [](CLI::App& sub) -> std::function<int()> {
  struct Args {
    std::string preset, out, draft_out;
    int draft_layers = 5;
    uint64_t seed = 1;
  };
  auto a = std::make_shared<Args>();
  sub.add_option("--preset", a->preset, "qwen3-0.6b or qwen3-8b")->required();
  sub.add_option("--out", a->out, "Target directory to write")->required();
  sub.add_option("--draft-out", a->draft_out, "Also write a DFlash drafter shaped like the public one");
  sub.add_option("--draft-layers", a->draft_layers, "Drafter layers (default 5)")->check(CLI::Range(1, 16));
  sub.add_option("--seed", a->seed);
  return [a] { return run_synth(a->preset, a->out, a->draft_out, a->draft_layers, a->seed); };
});

}  // namespace
}  // namespace dflash::cli
