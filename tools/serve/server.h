// ecokv serve: an OpenAI-compatible chat server (cpp-httplib) whose conversations live in compressed, reusable
// caches. POST /v1/chat/completions and /v1/completions, /tokenize, /detokenize; GET /v1/models, /props, /slots,
// /health and /metrics. Its rooms: requests are read by chat-request.cpp, admitted and run on the engine by the
// scheduler (scheduler.cpp), answered token by token (generation.cpp) in the shapes of responses.cpp; kept
// conversations live in cache tiers (cache-tier.h), this process's and, with --store, Redis shared by replicas
// (redis-store.h); /metrics is a table (metrics.h).
#pragma once

#include "chat-request.h"
#include "conversation-cache.h"
#include "redis-store.h"
#include "responses.h"
#include "decode-loop.h"
#include "scheduler.h"

#include "ecokv/llama-session.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace httplib {
class Server;
struct Request;
struct Response;
class DataSink;
}  // namespace httplib

namespace ecokv::serve {

class connection_pool;

struct serve_options {
    std::string              host = "127.0.0.1";
    int                      port = 8080;        // 0: any free port (see chat_server::port)
    int32_t                  slots = 8;          // requests generating at once (--slots)
    int32_t                  queue = 16;         // requests waiting for a slot; more get 503
    uint64_t                 cache_bytes = 256ull << 20;  // kept conversations
    std::string              model_name;         // what /v1/models lists and requests may name
    compression_defaults     kv;                 // the server's method flags, default on/off, head scores
    request_limits           limits;
    std::string              api_key;            // non-empty: every endpoint but /health needs "Bearer <key>"
    int32_t                  max_connections = 256;   // open at once; past it a 503 and the connection closed
    int32_t                  request_timeout_s = 10;  // a request's headers and body must arrive within it
    // -t 0: the cores the running requests share (the session's threads_now asks it); null: fixed threads
    std::shared_ptr<core_share> core_users;
    std::optional<store_options> store;  // --store: kept entries shared with other replicas through Redis
    // The decode loop (issue 50): every answer decodes in one context whose KV memory all sequences share, rows per
    // head: kv_kept_rows for compressed prompts' kept entries, the rest of -c (the session's n_ctx) cells; requests
    // admitted while their cells and kept rows fit, one prefill at a time. Off: each request decodes in its own context.
    bool                         batch        = true;
    int32_t                      kv_kept_rows = -1;  // -1: half of -c when compressing, else 0
    int32_t                      lanes = 1;  // the loop's pieces of engine work at once (decode_loop)
    int32_t                      cores = 1;  // the threads of a piece alone
};

class chat_server {
  public:
    chat_server(const llama::session & s, serve_options o);
    ~chat_server();

    // Binds and serves until stop(); false when the address cannot be bound.
    bool listen();
    // Binds to o.port (0: a free one) without serving yet; then listen() serves.
    int  bind();
    void stop();
    int  port() const { return port_; }

  private:
    using handler        = void (chat_server::*)(const httplib::Request &, httplib::Response &);
    using request_parser = chat_request (*)(const nlohmann::json &, const request_limits &);
    struct route {
        const char * method;  // "GET" or "POST"
        const char * path;
        handler      fn;
    };
    static const std::vector<route> & route_table();

    void setup_http();
    void health(const httplib::Request & req, httplib::Response & res);
    void models(const httplib::Request & req, httplib::Response & res);
    void metrics(const httplib::Request & req, httplib::Response & res);
    void tokenize(const httplib::Request & req, httplib::Response & res);
    void detokenize(const httplib::Request & req, httplib::Response & res);
    void page(const httplib::Request & req, httplib::Response & res);
    void props(const httplib::Request & req, httplib::Response & res);
    void slots(const httplib::Request & req, httplib::Response & res);
    void chat_completions(const httplib::Request & req, httplib::Response & res);
    void completions(const httplib::Request & req, httplib::Response & res);

    // An OpenAI endpoint: the request parsed, admitted, begun on the engine, its answer streamed by generate().
    void chat(const httplib::Request & req, httplib::Response & res, request_parser parse);
    void generate(turn & t, const chat_request & r, const answer_header & h, httplib::DataSink & sink);
    void decode_next(turn & t, llama_token tok, int32_t n_new);
    nlohmann::json memory_json() const;

    const llama::session &           s_;
    serve_options                    o_;
    std::unique_ptr<httplib::Server> http_;
    conversation_cache               cache_;  // this process's tier
    std::unique_ptr<redis_store>     store_;  // with --store: the replicas' shared tier
    tiered_cache                     tiers_;
    serve_stats                      stats_;
    std::unique_ptr<decode_loop>     loop_;  // null: --no-batch
    scheduler                        scheduler_;
    std::atomic<connection_pool *>   connections_{ nullptr };  // while listening
    int                              port_ = 0;
};

}  // namespace ecokv::serve
