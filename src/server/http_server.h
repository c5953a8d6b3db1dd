#pragma once
// The OpenAI-compatible HTTP front end: routes, admission into the request queue, streamed
// and whole responses, errors, /health and /metrics. httplib stays inside http_server.cc.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/generation.h"
#include "tokenizer/tokenizer.h"

namespace dflash::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                   // 0: any free port (bind() says which)
  std::string model_id;              // the name clients must send as "model"
  size_t max_queue = 64;             // requests waiting beyond the running one
  double request_timeout = 600;      // seconds from arrival; 0: none
  size_t max_body_bytes = 8 << 20;
  int http_threads = 0;              // 0: max_queue + 16
  int64_t default_max_tokens = 0;    // chat without max_tokens; 0: the rest of the context
  double shutdown_grace = 30;        // seconds in-flight requests get to finish on shutdown
  std::string chat_template;         // Jinja source replacing the tokenizer's; empty: the tokenizer's
  int slowdown_ms = 0;               // test hook: sleep after each commit
};

class HttpServer {
 public:
  HttpServer(Engine& engine, const Tokenizer& tokenizer, std::vector<int32_t> eos_ids, ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; returns the port. Throws dflash::Error on failure.
  int bind();
  // Serves until shutdown() completes.
  void run();
  // Graceful: new requests get 503, waiting ones are refused with 503, in-flight ones finish
  // (up to shutdown_grace seconds, then they are cut), then run() returns. Thread-safe.
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dflash::server
