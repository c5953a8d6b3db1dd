// dflash bench: plain against speculative decoding over a prompt file, and the CPU's
// memory-bandwidth bound for plain decoding, measured in the same run.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/validators.h"
#ifdef DFLASH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "util/error.h"

namespace dflash::cli {
namespace {

struct BenchArgs {
  ModelArgs model;
  std::string prompts_file;
  std::string prompt_ids;
  std::string json_out;
  int max_new_tokens = 128;
  int prefill_runs = 5;  // 0: no prefill timing
  int warmup = 1;          // untimed runs of the first prompt before the timed ones
  int warmup_tokens = 16;  // new tokens of each (at most the prompt's own)
  bool chat = false;
  bool bandwidth = false;
  bool ignore_eos = false;
  bool graph_probe = false;
  SamplingArgs sampling;  // greedy unless given; the same draws for plain and speculative
};

struct BenchPrompt {
  std::string name;
  std::vector<int32_t> ids;
  int max_new_tokens;
};

std::vector<BenchPrompt> read_prompts(const BenchArgs& a, const LoadedModels& m) {
  std::vector<BenchPrompt> out;
  if (!a.prompt_ids.empty()) out.push_back({"prompt-ids", parse_token_ids(a.prompt_ids), a.max_new_tokens});
  if (a.prompts_file.empty()) return out;
  std::ifstream in(a.prompts_file);
  if (!in) throw Error(a.prompts_file + ": cannot open");
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(a.prompts_file + ":" + std::to_string(n) + ": malformed JSON: " + e.what());
    }
    BenchPrompt p;
    p.name = j.value("name", "line " + std::to_string(n));
    p.max_new_tokens = j.value("max_new_tokens", a.max_new_tokens);
    if (j.contains("prompt_ids")) p.ids = j["prompt_ids"].get<std::vector<int32_t>>();
    else if (j.contains("prompt") && j["prompt"].is_string())
      p.ids = encode_prompt(j["prompt"].get<std::string>(), a.chat, "", false, m);
    else throw Error(a.prompts_file + ":" + std::to_string(n) + ": needs \"prompt\" (text) or \"prompt_ids\"");
    out.push_back(std::move(p));
  }
  return out;
}

// Copy bandwidth of this machine (bytes read + written per second) over buffers far larger
// than the caches, every core copying its own slice as decoding streams with every core; the
// best of a few passes.
double copy_bandwidth() {
  const size_t n = size_t(1) << 29;  // 512 MiB each way
  std::vector<char> src(n, 1), dst(n, 0);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
    {
      const size_t threads = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
      const size_t chunk = (n + threads - 1) / threads, begin = std::min(n, t * chunk);
      std::memcpy(dst.data() + begin, src.data() + begin, std::min(n, begin + chunk) - begin);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * double(n) / s);
    src[rep] = dst[n - 1 - rep];  // keep the copies observable
  }
  return best;
}

// Prefill of one prompt (the longest given), timed apart from generation: the forward pass over
// the prompt with the last row's logits read back (what a first token waits for), then, with a
// drafter, its context update from the target's features (device time between two marks). The
// median of `runs`, after the generation above has warmed every path up.
void measure_prefill(LoadedModels& m, const std::vector<int32_t>& prompt, int runs, nlohmann::json& report) {
  Qwen3Model& target = *m.target;
  const std::vector<int> features = m.drafter ? m.drafter->config().target_layer_ids : std::vector<int>{};
  std::vector<float> last(size_t(target.config().vocab_size));
  std::vector<double> target_ms, drafter_ms;
  for (int rep = 0; rep < runs; ++rep) {
    SequenceState ts = target.new_sequence(int64_t(prompt.size()) + 1);
    auto t0 = std::chrono::steady_clock::now();
    const ForwardOutput out = target.forward(ts, prompt, false, features);
    m.backend->download(out.logits, last.data());
    auto t1 = std::chrono::steady_clock::now();
    target_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    if (m.drafter) {
      SequenceState ds = m.drafter->new_sequence(int64_t(prompt.size()) + m.drafter->config().block_size);
      const auto from = m.backend->mark();
      m.drafter->add_context(ds, out.features);
      const auto to = m.backend->mark();
      drafter_ms.push_back(1e3 * m.backend->seconds_between(*from, *to));
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double tm = median(target_ms);
  std::printf("prefill %zu tokens: %.3f ms (median of %d), %.0f tokens/s", prompt.size(), tm, runs,
              1e3 * double(prompt.size()) / tm);
  report["prefill"] = {{"tokens", prompt.size()}, {"target_ms", tm}, {"tokens_per_second", 1e3 * double(prompt.size()) / tm}};
  if (m.drafter) {
    const double dm = median(drafter_ms);
    std::printf("; drafter context %.3f ms", dm);
    report["prefill"]["drafter_context_ms"] = dm;
  }
  std::printf("\n");
}

#ifdef DFLASH_CUDA
// --graph-probe: how much of a step's GPU time CUDA graphs would recover. Each of a decode
// step, a verification of a block and a draft of a block runs at a fixed place after the
// prompt (the state rolled back before each call, so every call queues the same work at the
// same addresses), launched op by op and replayed from a graph captured from one call. Each
// pass is the greedy loops' own: ids in from the device and its greedy choices out, no logits.
void run_graph_probe(LoadedModels& m, const std::vector<int32_t>& prompt, nlohmann::json& report) {
  Qwen3Model& target = *m.target;
  const int B = m.drafter ? m.drafter->config().block_size : 16;
  const std::vector<int> features = m.drafter ? m.drafter->config().target_layer_ids : std::vector<int>{};
  SequenceState ts = target.new_sequence(int64_t(prompt.size()) + B + 1);
  const ForwardOutput prefill = target.forward(ts, prompt, false, features);
  const int64_t s = ts.length();
  const int32_t anchor = prompt.back();
  const std::vector<int32_t> block(size_t(B), anchor);
  nlohmann::json out = nlohmann::json::object();
  auto probe = [&](const char* name, const std::function<void()>& step) {
    const cuda::GraphProbe g = cuda::graph_probe(*m.backend, step, 50);
    std::printf("graph probe %-22s launched %.3f ms, graph %.3f ms (%.3fx); %zu nodes, %zu edges, %zu programmatic\n",
                name, g.launched_ms, g.replayed_ms, g.launched_ms / g.replayed_ms, g.nodes, g.edges,
                g.programmatic_edges);
    std::printf("graph probe %-22s host: queue %.3f ms, capture %.3f, instantiate %.3f, update %.3f\n", name,
                g.host_enqueue_ms, g.host_capture_ms, g.host_instantiate_ms, g.host_update_ms);
    out[name] = {{"launched_ms", g.launched_ms},        {"graph_ms", g.replayed_ms},
                 {"nodes", g.nodes},                    {"edges", g.edges},
                 {"programmatic_edges", g.programmatic_edges},
                 {"host_enqueue_ms", g.host_enqueue_ms}, {"host_capture_ms", g.host_capture_ms},
                 {"host_instantiate_ms", g.host_instantiate_ms}, {"host_update_ms", g.host_update_ms}};
  };
  Backend& b = *m.backend;
  Tensor anchor_id = b.alloc(1, 1, DType::I32), next_id = b.alloc(1, 1, DType::I32);
  Tensor block_ids = b.alloc(B, 1, DType::I32), choice_ids = b.alloc(B, 1, DType::I32);
  Tensor draft_ids = b.alloc(B - 1, 1, DType::I32);
  b.write_ids({anchor}, anchor_id);
  b.write_ids(block, block_ids);
  probe("decode (1 row)", [&] {
    ts.truncate(s);
    target.forward(ts, anchor_id, false, {}, &next_id);
  });
  probe("verify (block rows)", [&] {
    ts.truncate(s);
    target.forward(ts, block_ids, true, features, &choice_ids);
  });
  if (m.drafter) {
    SequenceState ds = m.drafter->new_sequence(s + B);
    m.drafter->add_context(ds, prefill.features);
    probe("draft (block rows)", [&] { m.drafter->draft(ds, anchor, B, B, &draft_ids); });
    // The drafter's context update for a verified block (every row of it, as the queued loop
    // projects them), on the features of a verification at the same place.
    ts.truncate(s);
    const ForwardOutput verified = target.forward(ts, block, true, features);
    probe("context (block rows)", [&] {
      ds.truncate(s);
      m.drafter->add_context(ds, verified.features);
    });
  }
  // What the loops add to these passes: a step's passes replayed back to back against the step
  // the speculative loop measured, and a decode graph against the plain loop's token (issue 6's
  // ratios are of the loops; these say how much of the distance to the roofline is the passes').
  auto ms = [&](const char* name) { return out[name]["graph_ms"].get<double>(); };
  if (report.contains("bandwidth_bound_tokens_per_second")) {
    const double bound_ms = 1e3 / report["bandwidth_bound_tokens_per_second"].get<double>();
    std::printf("graph probe: a decode pass as a graph %.3f ms = %.1f%% of the bound", ms("decode (1 row)"),
                100 * bound_ms / ms("decode (1 row)"));
    if (report.contains("plain_total")) {
      const double tps = report["plain_total"].value("decode_tokens_per_second", 0.0);
      if (tps > 0) std::printf("; the plain loop's token %.3f ms", 1e3 / tps);
    }
    std::printf("\n");
  }
  if (m.drafter && report.contains("step_roofline_seconds")) {
    const double floor_ms = 1e3 * report["step_roofline_seconds"].get<double>();
    const double passes = ms("draft (block rows)") + ms("verify (block rows)") + ms("context (block rows)");
    std::printf("graph probe: draft + verify + context as graphs %.3f ms = %.3fx the step's roofline", passes,
                passes / floor_ms);
    if (report.contains("step_seconds"))
      std::printf("; the loop's step %.3f ms (%+.3f)", 1e3 * report["step_seconds"].get<double>(),
                  1e3 * report["step_seconds"].get<double>() - passes);
    std::printf("\n");
    out["step_passes_ms"] = passes;
  }
  report["graph_probe"] = out;
}
#endif

int run_bench(BenchArgs& a) {
  LoadedModels m = load_models(a.model);
  const auto prompts = read_prompts(a, m);
  if (prompts.empty()) throw Error("give prompts with --prompts FILE.jsonl or --prompt-ids");
  nlohmann::json report = {{"model", a.model.model_dir}, {"draft", a.model.draft_dir}, {"device", m.backend->name()},
                            {"forced_acceptance", a.model.forced_acceptance}};
  if (a.model.forced_acceptance > 0)
    std::printf("FORCED ACCEPTANCE %d: every step commits %d tokens; outputs are not the target's\n",
                a.model.forced_acceptance, a.model.forced_acceptance);
  double bw = 0;  // bytes read + written per second on the device that runs the model
  if (a.bandwidth) {
#ifdef DFLASH_CUDA
    if (m.backend->device() == DeviceKind::CUDA) bw = cuda::copy_bandwidth(size_t(1) << 32);
#endif
    if (bw == 0) bw = copy_bandwidth();
    const double bytes = double(m.target->weight_bytes_per_token());
    report["copy_bandwidth_gbs"] = bw / 1e9;
    report["weight_bytes_per_token"] = bytes;
    report["bandwidth_bound_tokens_per_second"] = bw / bytes;
    std::printf("%s copy bandwidth %.2f GB/s (read + write); %.1f MB of weights per token; bound %.2f tokens/s\n",
                m.backend->name().c_str(), bw / 1e9, bytes / 1e6, bw / bytes);
  }
  auto request_for = [&](const BenchPrompt& p) {
    GenerationRequest req;
    req.prompt = p.ids;
    req.max_new_tokens = p.max_new_tokens;
    req.sampling = a.sampling.params();
    if (!a.ignore_eos) req.eos_ids = m.eos_ids();
    return req;
  };
  // A first request pays once for what later ones reuse: on a GPU the CUDA graphs' first
  // instantiation (a decode step after prefill took 8.2 ms against 4.5, H200 timeline), scratch
  // from the driver, cuBLAS loading its kernels. The timed runs leave that out, as the
  // transformers baseline (tools/hf_side_by_side.py) does with its own warm-up; the block
  // controller's history is cleared so they start from what a fresh engine knows. The warm-up is
  // short by default: a GPU that runs for a second or more reaches its power cap and lowers its
  // clocks (an H200 at 700 W: docs/benchmarks.md, thirty-eighth pass), so longer warm-ups
  // (--warmup-tokens) measure sustained decoding, the default a request on an idle GPU.
  for (int w = 0; w < a.warmup; ++w) {
    GenerationRequest req = request_for(prompts.front());
    req.max_new_tokens = std::min(req.max_new_tokens, a.warmup_tokens);
    m.engine->generate_plain(req);
    if (m.drafter) m.engine->generate_speculative(req);
  }
  if (a.warmup > 0) m.engine->forget_history();
  report["warmup_runs"] = a.warmup;
  report["warmup_tokens"] = a.warmup_tokens;
  std::printf("%-24s %7s %12s %12s %8s %6s  %s\n", "prompt", "tokens", "plain tok/s", "spec tok/s", "speedup", "tau",
              "acceptance histogram / block");
  GenerationStats spec_total, plain_total;
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& p : prompts) {
    const GenerationRequest req = request_for(p);
    const auto plain = m.engine->generate_plain(req);
    plain_total.merge(plain.stats);
    nlohmann::json row = {{"name", p.name}, {"prompt_tokens", p.ids.size()}, {"plain", plain.stats.to_json()}};
    const double plain_tps = plain.stats.decode_tokens_per_second();
    if (m.drafter) {
      const auto spec = m.engine->generate_speculative(req);
      spec_total.merge(spec.stats);
      const double spec_tps = spec.stats.decode_tokens_per_second();
      row["speculative"] = spec.stats.to_json();
      row["speedup"] = spec_tps / plain_tps;
      row["identical_output"] = spec.tokens == plain.tokens;
      std::string hist;
      for (auto c : spec.stats.acceptance_histogram) hist += std::to_string(c) + " ";
      hist += "/ " + std::to_string(spec.stats.final_block_size);
      std::printf("%-24.24s %7zu %12.1f %12.1f %7.2fx %6.2f  %s%s\n", p.name.c_str(), plain.tokens.size(), plain_tps,
                  spec_tps, spec_tps / plain_tps, spec.stats.mean_acceptance_length(), hist.c_str(),
                  spec.tokens == plain.tokens || a.model.forced_acceptance || !req.sampling.greedy() ? "" : "  OUTPUT DIFFERS");
    } else {
      std::printf("%-24.24s %7zu %12.1f\n", p.name.c_str(), plain.tokens.size(), plain_tps);
    }
    rows.push_back(row);
  }
  report["prompts"] = rows;
  report["plain_total"] = plain_total.to_json();
  const double plain_tps = plain_total.decode_tokens_per_second();
  if (m.drafter) {
    report["speculative_total"] = spec_total.to_json();
    const double spec_tps = spec_total.decode_tokens_per_second();
    report["speedup"] = spec_tps / plain_tps;
    std::printf("%-24s %7lld %12.1f %12.1f %7.2fx %6.2f\n", "ALL", (long long)spec_total.generated_tokens, plain_tps,
                spec_tps, spec_tps / plain_tps, spec_total.mean_acceptance_length());
    std::printf("%s", spec_total.to_text().c_str());
    if (bw > 0 && spec_total.steps > 0) {
      // A step's floor: the target's weights once for the block plus the drafter's.
      const double bytes = double(m.target->weight_bytes_per_token() + m.drafter->weight_bytes_per_step());
      const double step = (spec_total.draft_seconds + spec_total.verify_seconds) / double(spec_total.steps);
      const double floor = bytes / bw;
      report["step_seconds"] = step;
      report["step_roofline_seconds"] = floor;
      std::printf("DFlash step %.3f ms (draft %.3f + verify %.3f); roofline %.3f ms (%.2f GB at %.0f GB/s): %.2fx\n",
                  1e3 * step, 1e3 * spec_total.draft_seconds / double(spec_total.steps),
                  1e3 * spec_total.verify_seconds / double(spec_total.steps), 1e3 * floor, bytes / 1e9, bw / 1e9,
                  step / floor);
    }
  } else {
    std::printf("%-24s %7lld %12.1f\n", "ALL", (long long)plain_total.generated_tokens, plain_tps);
  }
  if (bw > 0) {
    const double bound = bw / double(m.target->weight_bytes_per_token());
    std::printf("plain decode %.1f tokens/s = %.1f%% of the %.1f tokens/s bound\n", plain_tps, 100 * plain_tps / bound,
                bound);
  }
#ifdef DFLASH_CUDA
  if (m.backend->device() == DeviceKind::CUDA) {
    const cuda::GraphCounts g = cuda::graph_counts(*m.backend);
    std::printf("CUDA graphs: %lld launched, %lld updated in place, %lld instantiated\n", (long long)g.launched,
                (long long)g.updated, (long long)g.instantiated);
    if (!g.first_refusal.empty()) std::printf("CUDA graphs: first refused update: %s\n", g.first_refusal.c_str());
    report["cuda_graphs"] = {{"launched", g.launched},
                             {"updated", g.updated},
                             {"instantiated", g.instantiated},
                             {"first_refusal", g.first_refusal}};
  }
#endif
  if (a.prefill_runs > 0) {
    const auto longest = std::max_element(prompts.begin(), prompts.end(), [](const BenchPrompt& x, const BenchPrompt& y) {
      return x.ids.size() < y.ids.size();
    });
    measure_prefill(m, longest->ids, a.prefill_runs, report);
  }
  if (a.graph_probe) {
#ifdef DFLASH_CUDA
    if (m.backend->device() != DeviceKind::CUDA) throw Error("--graph-probe needs --device cuda");
    run_graph_probe(m, prompts.front().ids, report);
#else
    throw Error("--graph-probe needs a build with -DDFLASH_CUDA=ON");
#endif
  }
  if (!a.json_out.empty()) {
    std::ofstream(a.json_out) << report.dump(2) << "\n";
    std::printf("wrote %s\n", a.json_out.c_str());
  }
  return 0;
}

RegisterCommand reg("bench", "Benchmark plain against speculative decoding over a prompt file",
                    [](CLI::App& sub) -> std::function<int()> {
  auto a = std::make_shared<BenchArgs>();
  add_model_options(sub, a->model);
  sub.add_option("--prompts", a->prompts_file, "JSON lines: {\"prompt\": text} or {\"prompt_ids\": [...]}, optional \"name\", \"max_new_tokens\"");
  sub.add_option("--prompt-ids", a->prompt_ids, "One prompt as comma-separated token ids");
  sub.add_option("-n,--max-new-tokens", a->max_new_tokens, "Tokens per prompt (default 128)")->check(positive());
  sub.add_option("--prefill-runs", a->prefill_runs,
                 "Time the longest prompt's prefill this many times and print the median (default 5; 0 skips it)")
      ->check(CLI::Range(0, 1000));
  sub.add_option("--warmup", a->warmup,
                 "Untimed runs of the first prompt (plain and speculative) before the timed ones (default 1)")
      ->check(CLI::Range(0, 100));
  sub.add_option("--warmup-tokens", a->warmup_tokens, "New tokens of each warm-up run (default 16)")
      ->check(positive());
  sub.add_flag("--chat", a->chat, "Wrap text prompts in the chat template");
  sub.add_flag("--ignore-eos", a->ignore_eos, "Generate max-new-tokens even past end-of-sequence");
  sub.add_flag("--bandwidth", a->bandwidth, "Also measure copy bandwidth and the plain-decode bound");
  sub.add_flag("--graph-probe", a->graph_probe,
               "CUDA: time a decode step, a verification and a draft launched op by op against replayed from a CUDA graph");
  sub.add_option("--json", a->json_out, "Write the results as JSON");
  add_sampling_options(sub, a->sampling);
  return [a] { return run_bench(*a); };
});

}  // namespace
}  // namespace dflash::cli
