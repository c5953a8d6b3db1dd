#pragma once
// Collects committed tokens and decides when a request ends: an end-of-sequence id (kept),
// max_new_tokens, a stop check, or cancellation. Both loops commit through it so they end
// identically.
#include <chrono>

#include "engine/generation.h"

namespace dflash {

class OutputSink {
 public:
  OutputSink(const GenerationRequest& r, GenerationResult& out) : r_(r), out_(out) {}

  // Commits tokens in order until the request ends; returns false once it has.
  bool commit(const int32_t* tokens, size_t n) {
    const size_t before = out_.tokens.size();
    for (size_t i = 0; i < n && !done_; ++i) {
      out_.tokens.push_back(tokens[i]);
      for (int32_t e : r_.eos_ids)
        if (tokens[i] == e) finish(FinishReason::Stop);
      if (!done_ && static_cast<int>(out_.tokens.size()) >= r_.max_new_tokens) finish(FinishReason::Length);
    }
    if (r_.on_tokens && out_.tokens.size() > before) r_.on_tokens(out_.tokens.data() + before, out_.tokens.size() - before);
    if (!done_ && r_.stop_check && r_.stop_check(out_.tokens)) finish(FinishReason::Stop);
    if (!done_ && r_.cancelled && r_.cancelled()) finish(FinishReason::Cancelled);
    return !done_;
  }
  bool commit(int32_t token) { return commit(&token, 1); }
  // The context is full: nothing more can be generated.
  void context_exhausted() { finish(FinishReason::Length); }
  bool done() const { return done_; }
  const std::vector<int32_t>& tokens() const { return out_.tokens; }

 private:
  void finish(FinishReason f) {
    if (!done_) out_.finish = f;
    done_ = true;
  }
  const GenerationRequest& r_;
  GenerationResult& out_;
  bool done_ = false;
};

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace dflash
