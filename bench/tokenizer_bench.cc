// Single-thread encode throughput of dflash::Tokenizer over a JSON-lines corpus (one JSON
// string per line; default: the tokenizer test corpus). tools/bench_tokenizer.py runs this
// and the HF tokenizers library on the same corpus and prints both.
//   tokenizer_bench MODEL_DIR [CORPUS.jsonl] [REPEATS]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "util/error.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR [CORPUS.jsonl] [REPEATS]\n", argv[0]);
    return 2;
  }
  try {
    const std::string corpus_path =
        argc > 2 ? argv[2] : std::string(DFLASH_SOURCE_DIR) + "/testdata/tokenizers/fixtures/corpus.jsonl";
    const int repeats = argc > 3 ? std::stoi(argv[3]) : 5;
    std::ifstream in(corpus_path);
    if (!in) throw dflash::Error(corpus_path + ": cannot open");
    std::vector<std::string> texts;
    size_t bytes = 0;
    for (std::string line; std::getline(in, line);) {
      texts.push_back(nlohmann::json::parse(line).get<std::string>());
      bytes += texts.back().size();
    }
    const dflash::Tokenizer tok = dflash::Tokenizer::from_dir(argv[1]);
    size_t tokens = 0;
    for (const auto& t : texts) tokens += tok.encode(t).size();  // warm-up
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      size_t n = 0;
      for (const auto& t : texts) n += tok.encode(t).size();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, s);
      if (n != tokens) throw dflash::Error("nondeterministic token count");
    }
    std::printf("{\"impl\": \"dflash\", \"strings\": %zu, \"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.6f, "
                "\"mb_per_s\": %.3f}\n",
                texts.size(), bytes, tokens, best, bytes / best / 1e6);
  } catch (const dflash::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
