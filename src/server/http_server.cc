#include "server/http_server.h"

#include <atomic>
#include <ctime>
#include <thread>

#include "server/generation_runner.h"
#include "server/httplib_include.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/prompt.h"
#include "server/request_queue.h"
#include "util/error.h"

namespace dflash::server {
namespace {

using ojson = nlohmann::ordered_json;

void send_json(httplib::Response& res, int status, const ojson& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  send_json(res, e.status, error_json(e));
}

ApiError generic_error(int status, const httplib::Request& req, size_t max_body) {
  switch (status) {
    case 404:
      return ApiError(404, "invalid_request_error", "unknown_url", "unknown URL: " + req.method + " " + req.path);
    case 405:
      return ApiError(405, "invalid_request_error", "method_not_allowed", req.method + " is not allowed on " + req.path);
    case 413:
      return ApiError(413, "invalid_request_error", "request_too_large",
                      "the request body is larger than the server's limit of " + std::to_string(max_body) + " bytes");
    default:
      if (status < 500) return ApiError(status, "invalid_request_error", "bad_request", "the HTTP request is malformed");
      return ApiError(status, "server_error", "internal_error", "internal server error");
  }
}

}  // namespace

struct HttpServer::Impl {
  Impl(Engine& engine, const Tokenizer& tok, std::vector<int32_t> eos, ServerOptions o)
      : engine(engine), tokenizer(tok), opt(std::move(o)),
        runner(engine, tok, std::move(eos), metrics, opt.slowdown_ms),
        queue(opt.max_queue, [this](Job& j) { runner.run(j); }) {
    limits.vocab_size = engine.target().config().vocab_size;
    limits.context_length = engine.context_length();
    limits.default_max_tokens = opt.default_max_tokens;
    if (!opt.chat_template.empty()) {
      chat_template = std::make_unique<ChatTemplate>(opt.chat_template, "--chat-template");
      limits.chat_template = chat_template.get();
    }
    setup_routes();
  }

  void setup_routes();
  void handle_generation(Endpoint e, const httplib::Request& req, httplib::Response& res);
  std::shared_ptr<Job> admit(Endpoint e, const httplib::Request& req);
  void wait_until_started(const std::shared_ptr<Job>& job);
  void respond_whole(const std::shared_ptr<Job>& job, httplib::Response& res);
  void respond_stream(const std::shared_ptr<Job>& job, httplib::Response& res);
  void count(const httplib::Request& req, int status) { metrics.count_request(req.path, status); }
  void finished_one() {
    active.fetch_sub(1);
    active_cv.notify_all();
  }

  Engine& engine;
  const Tokenizer& tokenizer;
  ServerOptions opt;
  PromptLimits limits;
  std::unique_ptr<ChatTemplate> chat_template;
  Metrics metrics;
  GenerationRunner runner;
  RequestQueue queue;
  httplib::Server http;
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  std::atomic<uint64_t> next_id{1};
  std::atomic<bool> stopping{false};
  // Generation requests not yet fully answered (a stream counts until its last byte).
  std::atomic<int> active{0};
  std::mutex active_mu;
  std::condition_variable active_cv;
};

std::shared_ptr<Job> HttpServer::Impl::admit(Endpoint e, const httplib::Request& req) {
  if (stopping) {
    metrics.count_rejection("shutting_down");
    throw ApiError(503, "service_unavailable", "shutting_down", "the server is shutting down");
  }
  CompletionRequest r = parse_completion_request(e, req.body);
  if (r.model != opt.model_id)
    throw ApiError(404, "invalid_request_error", "model_not_found",
                   "the model '" + r.model + "' does not exist; this server serves '" + opt.model_id + "'", "model");
  PreparedPrompt p = prepare_prompt(r, tokenizer, limits);

  auto job = std::make_shared<Job>();
  job->request = std::move(r);
  job->prompt = std::move(p.ids);
  job->max_tokens = p.max_tokens;
  if (opt.request_timeout > 0)
    job->deadline = job->arrival + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt.request_timeout));
  job->meta.id = (e == Endpoint::ChatCompletions ? "chatcmpl-" : "cmpl-") + std::to_string(created) + "-" +
                 std::to_string(next_id.fetch_add(1));
  job->meta.created = static_cast<int64_t>(std::time(nullptr));
  job->meta.model = opt.model_id;

  switch (queue.submit(job)) {
    case RequestQueue::Admission::Accepted: break;
    case RequestQueue::Admission::Full:
      metrics.count_rejection("queue_full");
      throw ApiError(429, "rate_limit_error", "queue_full",
                     "the server is busy: " + std::to_string(opt.max_queue) + " requests are already waiting");
    case RequestQueue::Admission::ShuttingDown:
      metrics.count_rejection("shutting_down");
      throw ApiError(503, "service_unavailable", "shutting_down", "the server is shutting down");
  }
  wait_until_started(job);
  return job;
}

// Answering only once the job has left the queue means a request refused while waiting
// (deadline, shutdown) still gets a real status code, streamed or not.
void HttpServer::Impl::wait_until_started(const std::shared_ptr<Job>& job) {
  std::unique_lock lock(job->mu);
  while (job->state == Job::State::Queued) {
    if (job->cv.wait_until(lock, job->deadline) == std::cv_status::timeout && job->state == Job::State::Queued) {
      lock.unlock();
      if (queue.withdraw(job)) {
        metrics.count_rejection("queue_timeout");
        throw ApiError(503, "service_unavailable", "queue_timeout",
                       "the request waited longer than the server's request timeout for the engine");
      }
      lock.lock();  // the worker took it just now: it starts
      job->cv.wait(lock, [&] { return job->state != Job::State::Queued; });
    }
  }
  if (job->state == Job::State::Refused) {
    metrics.count_rejection("shutting_down");
    throw *job->error;
  }
}

void HttpServer::Impl::respond_whole(const std::shared_ptr<Job>& job, httplib::Response& res) {
  std::string text;
  {
    std::unique_lock lock(job->mu);
    job->cv.wait(lock, [&] { return job->state == Job::State::Done; });
    if (job->error) throw *job->error;
    text = std::move(job->pending);
  }
  ojson body = completion_response(job->request.endpoint, job->meta, text, job->finish_reason, job->usage);
  if (job->timed_out) body["timed_out"] = true;
  send_json(res, 200, body);
}

void HttpServer::Impl::respond_stream(const std::shared_ptr<Job>& job, httplib::Response& res) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  const Endpoint e = job->request.endpoint;
  const bool usage = job->request.include_usage;
  // OpenAI opens a chat stream with the role alone; writing at once also finds a client
  // that left while queued.
  auto first = std::make_shared<bool>(e == Endpoint::ChatCompletions);
  auto provider = [this, job, e, usage, first](size_t, httplib::DataSink& sink) -> bool {
    std::string out;
    if (*first) {
      out += sse_event(stream_chunk(e, job->meta, "", "", true, usage));
      *first = false;
    }
    bool done;
    std::string piece;
    {
      std::unique_lock lock(job->mu);
      if (out.empty())
        job->cv.wait_for(lock, std::chrono::milliseconds(250),
                         [&] { return !job->pending.empty() || job->state == Job::State::Done; });
      piece.swap(job->pending);
      done = job->state == Job::State::Done;
    }
    if (!piece.empty()) out += sse_event(stream_chunk(e, job->meta, piece, "", false, usage));
    if (done) {
      if (job->error) {
        out += sse_event(error_json(*job->error));
      } else {
        ojson last = stream_chunk(e, job->meta, "", job->finish_reason, false, usage);
        if (job->timed_out) last["timed_out"] = true;
        out += sse_event(last);
        if (usage) out += sse_event(usage_chunk(e, job->meta, job->usage));
      }
      out += "data: [DONE]\n\n";
    }
    if (!out.empty() && !sink.write(out.data(), out.size())) {
      job->client_gone = true;  // the worker stops at its next commit
      return false;
    }
    if (done) sink.done();
    return true;
  };
  active.fetch_add(1);  // released with the response, after the last byte
  res.set_chunked_content_provider("text/event-stream", provider, [this, job](bool ok) {
    if (!ok) job->client_gone = true;
    finished_one();
  });
}

void HttpServer::Impl::handle_generation(Endpoint e, const httplib::Request& req, httplib::Response& res) {
  active.fetch_add(1);
  try {
    auto job = admit(e, req);
    if (job->request.stream)
      respond_stream(job, res);
    else
      respond_whole(job, res);
  } catch (const ApiError& err) {
    send_error(res, err);
  } catch (const std::exception& ex) {
    send_error(res, ApiError(500, "server_error", "internal_error", std::string("internal error: ") + ex.what()));
  } catch (...) {
    send_error(res, ApiError(500, "server_error", "internal_error", "internal error"));
  }
  count(req, res.status);
  finished_one();
}

void HttpServer::Impl::setup_routes() {
  const int threads = opt.http_threads > 0 ? opt.http_threads : static_cast<int>(opt.max_queue) + 16;
  // Every waiting request holds an HTTP thread, so there must be more threads than queue slots
  // for the queue's own limit (not httplib's backlog) to decide.
  http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http.set_payload_max_length(opt.max_body_bytes);
  http.set_tcp_nodelay(true);

  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(Endpoint::Completions, req, res);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(Endpoint::ChatCompletions, req, res);
  });
  for (const char* path : {"/v1/completions", "/v1/chat/completions"})
    http.Get(path, [this](const httplib::Request& req, httplib::Response& res) {
      send_error(res, generic_error(405, req, opt.max_body_bytes));
      count(req, res.status);
    });

  auto model_card = [this] {
    return ojson{{"id", opt.model_id}, {"object", "model"}, {"created", created}, {"owned_by", "dflash"},
                 {"max_model_len", limits.context_length}};
  };
  http.Get("/v1/models", [this, model_card](const httplib::Request& req, httplib::Response& res) {
    send_json(res, 200, {{"object", "list"}, {"data", ojson::array({model_card()})}});
    count(req, res.status);
  });
  http.Get(R"(/v1/models/(.+))", [this, model_card](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] == opt.model_id)
      send_json(res, 200, model_card());
    else
      send_error(res, ApiError(404, "invalid_request_error", "model_not_found",
                               "the model '" + std::string(req.matches[1]) + "' does not exist", "model"));
    count(req, res.status);
  });
  http.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
    if (stopping)
      send_json(res, 503, {{"status", "shutting_down"}});
    else
      send_json(res, 200, {{"status", "ok"}});
    count(req, res.status);
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(queue.gauges()), "text/plain; version=0.0.4; charset=utf-8");
  });

  // httplib's own errors (no route, body too large, unreadable request) in the OpenAI shape;
  // responses the handlers already wrote keep their body.
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                     httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, generic_error(res.status, req, opt.max_body_bytes));
    count(req, res.status);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what += std::string(": ") + e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, "server_error", "internal_error", what));
  });
}

HttpServer::HttpServer(Engine& engine, const Tokenizer& tokenizer, std::vector<int32_t> eos_ids, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, tokenizer, std::move(eos_ids), std::move(options))) {}

HttpServer::~HttpServer() {
  impl_->queue.shutdown();
  impl_->runner.abort_all();
  impl_->queue.join();
}

int HttpServer::bind() {
  auto& o = impl_->opt;
  int port = o.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
    if (port < 0) throw Error("cannot listen on " + o.host + " (any port)");
  } else if (!impl_->http.bind_to_port(o.host, port)) {
    throw Error("cannot listen on " + o.host + ":" + std::to_string(port) + " (in use, or no permission?)");
  }
  return port;
}

void HttpServer::run() { impl_->http.listen_after_bind(); }

void HttpServer::shutdown() {
  Impl& s = *impl_;
  s.stopping = true;
  s.queue.shutdown();
  {
    std::unique_lock lock(s.active_mu);
    const auto grace = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s.opt.shutdown_grace));
    if (!s.active_cv.wait_for(lock, grace, [&] { return s.active.load() == 0; })) {
      s.runner.abort_all();  // out of patience: cut the running generation short
      s.active_cv.wait_for(lock, std::chrono::seconds(5), [&] { return s.active.load() == 0; });
    }
  }
  s.http.stop();
}

}  // namespace dflash::server
