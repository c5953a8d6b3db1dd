// Host time of token_distribution (the sampling warpers) on one row of a Qwen3-sized vocabulary,
// for the warper settings of docs/benchmarks.md's sampling table; then a draw through
// LogitRows on the CPU backend (reading the row, building its law, drawing) for temperature
// alone, with the row left where it is (DFLASH_LOGIT_ROWS=device, the GPU's form) and read
// whole (=whole, what the CPU backend uses). The row: N(0, 3²) logits rounded to quarters (so
// ties occur), seed 5. Last, a drafted block of 16 flat rows under top-p alone drawn in one
// LogitRows::choose_rows call.
//   sampling_bench [VOCAB] [REPEATS]
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/logit_rows.h"
#include "engine/sampling.h"

int main(int argc, char** argv) {
  const int vocab = argc > 1 ? std::stoi(argv[1]) : 151936;
  const int repeats = argc > 2 ? std::stoi(argv[2]) : 20;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (auto& x : logits) x = static_cast<float>(static_cast<int>(nd(rng) * 4.f)) / 4.f;
  struct Setting {
    double temperature;
    int top_k;
    double top_p, min_p;
  };
  const Setting settings[] = {{0.6, 20, 0.95, 0}, {1.2, 200, 0.8, 0}, {0.7, 0, 0.9, 0},
                              {1.0, 0, 0.99, 0},  {0.8, 0, 1.0, 0.05}, {1.0, 0, 1.0, 0}};
  std::printf("vocab %d, %d repeats\n%-40s %10s %8s\n", vocab, repeats, "warpers", "ms/row", "kept");
  for (const auto& s : settings) {
    dflash::SamplingParams p;
    p.temperature = s.temperature;
    p.top_k = s.top_k;
    p.top_p = s.top_p;
    p.min_p = s.min_p;
    int kept = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < repeats; ++r) {
      const auto probs = dflash::token_distribution(logits.data(), vocab, p, dflash::TokenHistory{});
      kept = 0;
      for (float v : probs.probs) kept += v > 0;
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / repeats;
    char name[64];
    std::snprintf(name, sizeof name, "T %.1f top-k %d top-p %.2f min-p %.2f", s.temperature, s.top_k, s.top_p, s.min_p);
    std::printf("%-40s %10.2f %8d\n", name, ms, kept);
  }
  auto cpu = dflash::make_cpu_backend();
  dflash::Tensor t = cpu->upload(logits.data(), 1, vocab);
  dflash::SamplingParams p;
  p.temperature = 1.0;
  for (const bool whole : {false, true}) {
    setenv("DFLASH_LOGIT_ROWS", whole ? "whole" : "device", 1);
    dflash::Rng draws(1);
    int32_t sink = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < repeats; ++r) {
      dflash::LogitRows rows(*cpu, p, vocab);
      rows.read(t);
      sink ^= rows.choose(0, draws);
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / repeats;
    std::printf("%-40s %10.2f %8d\n", whole ? "LogitRows T 1.0, rows read whole" : "LogitRows T 1.0, rows left (device form)", ms,
                sink);
  }
  unsetenv("DFLASH_LOGIT_ROWS");

  // A drafted block of 16 flat rows under top-p 0.9 alone: each nucleus is most of the
  // vocabulary, over the device's candidate cap, so each row is read whole; choose_rows builds
  // the 16 laws on OMP_NUM_THREADS threads (run it with OMP_NUM_THREADS=1 for the serial time).
  {
    const int block = 16;
    std::vector<float> flat(size_t(block) * vocab);
    std::uniform_real_distribution<float> ud(0.f, 0.5f);
    for (auto& x : flat) x = ud(rng);
    dflash::Tensor tb = cpu->upload(flat.data(), block, vocab);
    dflash::SamplingParams tp;
    tp.temperature = 0.7;
    tp.top_p = 0.9;
    dflash::Rng draws(2);
    std::vector<int32_t> out(block);
    const auto t0 = std::chrono::steady_clock::now();
    const int block_repeats = std::max(1, repeats / 4);
    for (int r = 0; r < block_repeats; ++r) {
      dflash::LogitRows rows(*cpu, tp, vocab);
      rows.read(tb);
      rows.choose_rows(out.data(), block, draws);
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / block_repeats;
    std::printf("%-40s %10.2f %8d   (ms per block of %d)\n", "LogitRows top-p 0.9, 16 flat rows", ms, out[0], block);
  }
  return 0;
}
