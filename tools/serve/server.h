// ecokv serve: an OpenAI-compatible chat server (cpp-httplib) whose conversations live in compressed, reusable
// caches. POST /v1/chat/completions and /v1/completions, /tokenize, /detokenize; GET /v1/models, /props, /slots,
// /health and /metrics.
#pragma once

#include "chat-request.h"
#include "conversation-cache.h"

#include "ecokv/llama-session.h"

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
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
    int32_t                  slots = 2;          // requests generating at once
    int32_t                  queue = 16;         // requests waiting for a slot; more get 503
    uint64_t                 cache_bytes = 256ull << 20;  // kept conversations
    std::string              model_name;         // what /v1/models lists and requests may name
    compression_defaults     kv;                 // the server's method flags, default on/off, head scores
    request_limits           limits;
    std::string              api_key;            // non-empty: every endpoint but /health needs "Bearer <key>"
    int32_t                  max_connections = 256;   // open at once; past it a 503 and the connection closed
    int32_t                  request_timeout_s = 10;  // a request's headers and body must arrive within it
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
    struct slot_guard;
    struct stats;
    struct turn;

    void                        routes();
    std::string                 metrics() const;
    std::shared_ptr<slot_guard> acquire();
    using request_parser = chat_request (*)(const nlohmann::json &, const request_limits &);
    void                        chat(const httplib::Request & req, httplib::Response & res, request_parser parse);
    std::shared_ptr<turn>       prepare(chat_request r, const compression & c);
    void                        generate(turn & t, httplib::DataSink & sink);

    const llama::session &           s_;
    serve_options                    o_;
    std::unique_ptr<httplib::Server> http_;
    conversation_cache               cache_;
    std::unique_ptr<stats>           stats_;
    std::atomic<connection_pool *>   connections_{ nullptr };  // while listening
    int                              port_ = 0;

    mutable std::mutex      slot_mutex_;
    std::condition_variable slot_free_;
    int32_t                 busy_ = 0, waiting_ = 0;
};

}  // namespace ecokv::serve
