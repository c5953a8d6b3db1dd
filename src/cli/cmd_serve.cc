// dflash serve: the OpenAI-compatible HTTP server over one loaded model pair.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/validators.h"
#include "server/http_server.h"
#include "util/error.h"

namespace dflash::cli {
namespace {

struct ServeArgs {
  ModelArgs model;
  server::ServerOptions server;
  std::string chat_template_file;
};

std::string default_model_id(const std::string& dir) {
  std::filesystem::path p(dir);
  if (!p.has_filename()) p = p.parent_path();  // "models/x/" names x
  return p.filename().string();
}

int run_serve(ServeArgs& a) {
  // SIGTERM/SIGINT are taken by one thread with sigwait, so every thread created from here
  // on (httplib's pool, the engine worker, OpenMP) must inherit them blocked.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);  // internal: wakes the signal thread when serving ends otherwise
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that hangs up is a failed write, not a dead server

  if (!a.chat_template_file.empty()) {
    std::ifstream in(a.chat_template_file, std::ios::binary);
    if (!in) throw Error(a.chat_template_file + ": cannot open the chat template");
    a.server.chat_template.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  LoadedModels m = load_models(a.model);
  if (!m.tokenizer) throw Error(a.model.model_dir + ": serve needs tokenizer.json in the model directory");
  std::vector<int32_t> eos = m.eos_ids();
  if (auto t = m.tokenizer->eos_id(); t && std::find(eos.begin(), eos.end(), *t) == eos.end()) eos.push_back(*t);
  if (a.server.model_id.empty()) a.server.model_id = default_model_id(a.model.model_dir);

  server::HttpServer http(*m.engine, *m.tokenizer, eos, a.server);
  const int port = http.bind();
  std::fprintf(stderr, "dflash serve: model '%s' (context %lld, %s), listening on http://%s:%d\n",
               a.server.model_id.c_str(), static_cast<long long>(m.engine->context_length()),
               m.drafter ? ("DFlash block " + std::to_string(m.engine->block_size())).c_str() : "no drafter",
               a.server.host.c_str(), port);
  std::fflush(stderr);

  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig == SIGUSR1) return;
    std::fprintf(stderr, "dflash serve: %s received, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    http.shutdown();
  });
  http.run();
  pthread_kill(waiter.native_handle(), SIGUSR1);
  waiter.join();
  std::fprintf(stderr, "dflash serve: stopped\n");
  return 0;
}

RegisterCommand reg("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /metrics)",
                    [](CLI::App& sub) -> std::function<int()> {
  auto a = std::make_shared<ServeArgs>();
  auto& s = a->server;
  add_model_options(sub, a->model);
  sub.add_option("--host", s.host, "Address to listen on")->capture_default_str();
  sub.add_option("--port", s.port, "Port (0: any free port, printed at startup)")
      ->check(CLI::Range(0, 65535))->capture_default_str();
  sub.add_option("--model-name", s.model_id, "Model id clients send (default: the model directory's name)");
  sub.add_option("--chat-template", a->chat_template_file,
                 "Jinja chat template file for /v1/chat/completions (replaces the tokenizer's)")
      ->check(CLI::ExistingFile);
  sub.add_option("--max-queue", s.max_queue, "Requests that may wait for the engine; more get 429")
      ->capture_default_str();
  sub.add_option("--request-timeout", s.request_timeout,
                 "Seconds a request may take from arrival, queueing included (0: no limit)")
      ->check(non_negative())->capture_default_str();
  sub.add_option("--max-body-bytes", s.max_body_bytes, "Largest request body; larger gets 413")
      ->check(positive())->capture_default_str();
  sub.add_option("--http-threads", s.http_threads, "HTTP worker threads (0: max-queue + 16)")
      ->check(non_negative());
  sub.add_option("--default-max-tokens", s.default_max_tokens,
                 "Chat completions without max_tokens generate at most this many (0: the rest of the context)")
      ->check(non_negative());
  sub.add_option("--shutdown-grace", s.shutdown_grace,
                 "Seconds in-flight requests get to finish after SIGTERM")->check(non_negative())
      ->capture_default_str();
  // Tests only: slows each commit so that concurrent requests reliably overlap.
  sub.add_option("--test-slowdown-ms", s.slowdown_ms)->group("")->check(non_negative());
  return [a] { return run_serve(*a); };
});

}  // namespace
}  // namespace dflash::cli
