#include "server.h"

#include "connections.h"
#include "metrics.h"
#include "common/json-text.h"

#include "ecokv/error.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <functional>

namespace ecokv::serve {

using json = nlohmann::json;
using ecokv::tools::json_text;
namespace el = ecokv::llama;

namespace {

// A JSON endpoint: fn's answer to the parsed body, or a 400 with OpenAI's error body.
void answer_json(const httplib::Request & req, httplib::Response & res, const std::function<json(const json &)> & fn) {
    try {
        const json body = json::parse(req.body, nullptr, false);
        if (!body.is_object()) {
            throw bad_request("", "the request body must be a JSON object");
        }
        res.set_content(json_text(fn(body)), "application/json");
    } catch (const request_error & e) {
        res.status = e.status;
        res.set_content(json_text(error_body(e)), "application/json");
    }
}

// a == b in time that depends on their lengths only, not on where they differ.
bool same_secret(const std::string & a, const std::string & b) {
    unsigned diff = unsigned(a.size() ^ b.size());
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
        diff |= unsigned(uint8_t(i < a.size() ? a[i] : 0) ^ uint8_t(i < b.size() ? b[i] : 0));
    }
    return diff == 0;
}

void send_json(httplib::Response & res, const json & body) { res.set_content(json_text(body), "application/json"); }

// The decode loop's KV memory: -c rows a head (the session's n_ctx), of which kv_kept_rows for kept entries, the
// rest cells; a sequence for each slot. By default, when the server compresses, room for twice the budget of every
// slot (AdaKV's heads take more than the budget, others less), at most half the rows.
el::batch_options pool_options(const el::session & s, const serve_options & o) {
    const int32_t rows = s.n_ctx();
    const int32_t kept = o.kv_kept_rows >= 0 ? o.kv_kept_rows
                         : o.kv.compress     ? std::min(rows / 2, 2 * o.slots * o.kv.server.params.budget)
                                             : 0;
    if (kept >= rows) {
        throw error("--kv-kept-rows " + std::to_string(kept) + " leaves no cells of the " + std::to_string(rows) +
                    " rows a head of -c");
    }
    return { rows - kept, kept, o.slots };
}

// Whether a turn decodes in the decode loop: not one that compresses while decoding or between turns (both need
// the queries of what it decodes, which the loop's context does not record), nor a full cache whose V is transposed
// (flash attention off: the loop's stores hold rows).
bool decodes_in_loop(const compression & c, const el::session & s) {
    if (c.enabled) {
        return c.decode_compress == 0 && c.recompress_slack < 0;
    }
    return s.options().flash_attn != LLAMA_FLASH_ATTN_TYPE_DISABLED;
}

}  // namespace

chat_server::chat_server(const el::session & s, serve_options o) :
    s_(s),
    o_(std::move(o)),
    http_(std::make_unique<httplib::Server>()),
    cache_(o_.cache_bytes),
    store_(o_.store ? std::make_unique<redis_store>(*o_.store, el::entry_header{ s_.fingerprint(), s_.cache_shape(), "" })
                    : nullptr),
    tiers_(cache_, store_.get()),
    loop_(o_.batch ? std::make_unique<decode_loop>(s_, pool_options(s_, o_), o_.queue, o_.lanes, o_.cores) : nullptr),
    scheduler_(s_, tiers_, stats_, o_.slots, o_.queue, o_.core_users.get(),
               loop_ ? engine_runner([loop = loop_.get()](const std::function<void()> & f) { loop->on_engine(f); })
                     : engine_runner()) {
    setup_http();
}

chat_server::~chat_server() { stop(); }

int chat_server::bind() {
    port_ = o_.port == 0 ? http_->bind_to_any_port(o_.host) : (http_->bind_to_port(o_.host, o_.port) ? o_.port : -1);
    return port_;
}

bool chat_server::listen() {
    if (port_ <= 0 && bind() <= 0) {
        return false;
    }
    const bool ok = http_->listen_after_bind();
    connections_  = nullptr;  // cpp-httplib deleted it
    return ok;
}

void chat_server::stop() {
    if (http_) {
        http_->stop();
    }
}

const std::vector<chat_server::route> & chat_server::route_table() {
    static const std::vector<route> table = {
        { "GET", "/", &chat_server::page },
        { "GET", "/health", &chat_server::health },
        { "GET", "/v1/models", &chat_server::models },
        { "GET", "/metrics", &chat_server::metrics },
        { "GET", "/props", &chat_server::props },
        { "GET", "/slots", &chat_server::slots },
        { "POST", "/tokenize", &chat_server::tokenize },
        { "POST", "/detokenize", &chat_server::detokenize },
        { "POST", "/v1/chat/completions", &chat_server::chat_completions },
        { "POST", "/v1/completions", &chat_server::completions },
    };
    return table;
}

void chat_server::setup_http() {
    httplib::Server & h = *http_;
    h.new_task_queue    = [this] {  // a thread per connection, a cap, a deadline for each request to arrive
        auto * pool  = new connection_pool(port_, size_t(o_.max_connections), std::chrono::seconds(o_.request_timeout_s));
        connections_ = pool;
        return pool;
    };
    h.set_read_timeout(5);  // per read and write; the whole request's deadline is the pool's
    h.set_write_timeout(5);
    h.set_keep_alive_timeout(5);
    h.set_keep_alive_max_count(100);
    h.set_logger([](const httplib::Request &, const httplib::Response &) { connection_pool::answer_sent(); });
    h.set_payload_max_length(64u << 20);
    h.set_tcp_nodelay(true);  // answers go out in small writes (stream chunks): no Nagle delay behind each
    for (const route & r : route_table()) {
        // Every handler runs once its request's body is read: the connection's deadline stops there.
        auto f = [this, fn = r.fn](const httplib::Request & req, httplib::Response & res) {
            connection_pool::request_received();
            (this->*fn)(req, res);
        };
        if (std::string(r.method) == "GET") {
            h.Get(r.path, std::move(f));
        } else {
            h.Post(r.path, std::move(f));
        }
    }
    if (!o_.api_key.empty()) {  // OpenAI's 401 for a missing or wrong key; /health stays open for load balancers
        h.set_pre_routing_handler([this](const httplib::Request & req, httplib::Response & res) {
            // The page and /health are open: the page asks for the key, load balancers probe /health.
            if (req.path == "/health" || req.path == "/" || same_secret(req.get_header_value("Authorization"), "Bearer " + o_.api_key)) {
                return httplib::Server::HandlerResponse::Unhandled;
            }
            ++stats_.errors;
            res.status = 401;
            json body  = error_body(request_error(401, "invalid_request_error", "",
                                                  "Incorrect or missing API key: send 'Authorization: Bearer <key>'"));
            body["error"]["code"] = "invalid_api_key";
            send_json(res, body);
            return httplib::Server::HandlerResponse::Handled;
        });
    }
    h.set_error_handler([](const httplib::Request &, httplib::Response & res) {
        if (res.body.empty()) {
            const std::string what = res.status == 404 ? "no such endpoint"
                                     : res.status == 413
                                         ? "the request body is too large (JSON up to 64 MiB; send it as "
                                           "application/json: form-encoded bodies are limited to 8 KiB)"
                                         : "the request was refused (HTTP " + std::to_string(res.status) + ")";
            const request_error e(res.status, res.status == 404 ? "not_found_error" : "invalid_request_error", "", what);
            send_json(res, error_body(e));
        }
    });
}

void chat_server::health(const httplib::Request &, httplib::Response & res) {
    json body = { { "status", "ok" } };  // serving, with or without its store
    if (store_) {
        body["store"] = store_->totals_now().up ? "up" : "down";
    }
    send_json(res, body);
}

void chat_server::models(const httplib::Request &, httplib::Response & res) {
    send_json(res, { { "object", "list" },
                     { "data", json::array({ { { "id", o_.model_name },
                                               { "object", "model" },
                                               { "created", 0 },
                                               { "owned_by", "ecokv" } } }) } });
}

void chat_server::metrics(const httplib::Request &, httplib::Response & res) {
    const auto     t         = cache_.totals_now();
    const auto     load      = scheduler_.load_now();
    const auto &   st        = stats_;
    const double   prefill_s = double(st.prefill_us) / 1e6, decode_s = double(st.decode_us) / 1e6;
    const double   prefilled = double(st.prompt_tokens) - double(st.cached_tokens);
    std::vector<metric> table = {
        { "requests_total", "counter", "chat completion requests", double(st.requests) },
        { "request_errors_total", "counter", "requests answered with an error", double(st.errors) },
        { "requests_rejected_total", "counter", "requests refused because every slot and the queue were full",
          double(st.rejected) },
        { "requests_cancelled_total", "counter", "generations stopped because the client went away",
          double(st.cancelled) },
        { "prompt_tokens_total", "counter", "prompt cells of all requests", double(st.prompt_tokens) },
        { "prompt_tokens_cached_total", "counter", "prompt cells served from kept conversations",
          double(st.cached_tokens) },
        { "completion_tokens_total", "counter", "generated tokens", double(st.completion_tokens) },
        { "cache_hits_total", "counter", "requests that continued a kept conversation", double(st.hits) },
        { "cache_prefix_hits_total", "counter", "requests that resumed a kept context (a page before its question)",
          double(st.prefix_hits) },
        { "cache_misses_total", "counter", "requests prefilled from the start", double(st.misses) },
        { "prefill_tokens_per_second", "gauge", "prefilled cells per second of prefill, all requests",
          prefill_s > 0 ? prefilled / prefill_s : 0 },
        { "decode_tokens_per_second", "gauge", "generated tokens per second of decoding, all requests",
          decode_s > 0 ? double(st.completion_tokens) / decode_s : 0 },
        { "kv_cache_conversations", "gauge", "conversations kept", double(t.conversations) },
        { "kv_cache_prefixes", "gauge", "contexts kept on their own, for any request about them", double(t.prefixes) },
        { "kv_cache_bytes", "gauge", "bytes of the kept conversations and contexts (compressed caches)", double(t.bytes) },
        { "kv_cache_full_bytes", "gauge", "bytes the kept entries would take as full caches",
          double(t.full_bytes) },
        { "kv_cache_evictions_total", "counter", "entries evicted to stay within --cache-mib",
          double(t.evictions) },
    };
    if (const connection_pool * pool = connections_) {
        const auto c = pool->totals_now();
        table.push_back({ "connections_open", "gauge", "HTTP connections open", double(c.open) });
        table.push_back({ "connections_refused_total", "counter", "connections refused past --max-connections",
                          double(c.refused) });
        table.push_back({ "connections_timed_out_total", "counter",
                          "connections closed for not sending their request within --request-timeout",
                          double(c.timed_out) });
    }
    if (store_) {
        const auto s = store_->totals_now();
        table.push_back({ "store_up", "gauge", "1 while the shared store (--store) answers", s.up ? 1.0 : 0.0 });
        table.push_back({ "store_hits_total", "counter", "requests that resumed an entry found in the shared store",
                          double(s.hits) });
        table.push_back({ "store_misses_total", "counter", "store lookups that found nothing longer than this replica's",
                          double(s.misses) });
        table.push_back({ "store_writes_total", "counter", "entries written to the store", double(s.writes) });
        table.push_back({ "store_writes_queued", "gauge", "entries waiting to be written, or being written",
                          double(s.queued) });
        table.push_back({ "store_write_errors_total", "counter", "writes the store refused or lost the connection on",
                          double(s.write_errors) });
        table.push_back({ "store_writes_dropped_total", "counter",
                          "entries not written: the store was down or the write queue full", double(s.dropped) });
        table.push_back({ "store_reconnects_total", "counter", "connections to the store made again after it was down",
                          double(s.reconnects) });
        for (size_t f = 0; f < s.refused.size(); ++f) {
            table.push_back({ "store_entries_refused_total", "counter",
                              "store entries refused, by fault, each request answered as a miss",
                              double(s.refused[f]),
                              std::string("fault=\"") + entry_fault_name(el::entry_fault(f)) + "\"" });
        }
    }
    table.push_back({ "slots_busy", "gauge", "requests generating now", double(load.busy) });
    table.push_back({ "requests_waiting", "gauge", "requests waiting for a slot", double(load.waiting) });
    if (loop_) {
        const auto l = loop_->load_now();
        table.push_back({ "kv_sequences_live", "gauge", "sequences in the decode loop", double(l.live) });
        table.push_back({ "kv_requests_waiting_memory", "gauge", "requests waiting for KV memory", double(l.waiting) });
        table.push_back({ "kv_cells_used", "gauge", "KV cells held or reserved for answers in the decode loop",
                          double(l.cells_promised) });
        table.push_back({ "kv_cells_total", "gauge", "KV cells of the decode loop", double(l.n_cells) });
        table.push_back({ "kv_kept_rows_used", "gauge", "kept rows of the fullest KV head", double(l.kept_rows_used) });
        table.push_back({ "kv_kept_rows_total", "gauge", "kept rows of every KV head", double(l.kept_rows) });
        table.push_back({ "decode_steps_total", "counter", "llama_decode calls of the decode loop", double(l.steps) });
        table.push_back({ "decode_step_tokens_total", "counter", "tokens those steps decoded", double(l.tokens) });
        table.push_back({ "answers_solo_total", "counter",
                          "answers decoded on their request's thread from start to end, nothing else running meanwhile",
                          double(stats_.solo) });
        table.push_back({ "answers_solo_joined_total", "counter",
                          "answers begun solo that entered the decode loop when another request came",
                          double(stats_.solo_joined) });
        table.push_back({ "answers_decoded_alone_total", "counter",
                          "answers decoded in a context of their own: compressing while decoding, never fitting the "
                          "loop's memory, or a cache it refused", double(stats_.decoded_alone) });
    }
    res.set_content(prometheus_text(table), "text/plain; version=0.0.4");
}

void chat_server::tokenize(const httplib::Request & req, httplib::Response & res) {
    answer_json(req, res, [&](const json & body) {
        const json & content = body.contains("content") ? body["content"] : json();
        if (!content.is_string()) {
            throw bad_request("content", "'content' must be a string");
        }
        const json & special = body.contains("add_special") ? body["add_special"] : json(false);
        const json & pieces  = body.contains("with_pieces") ? body["with_pieces"] : json(false);
        if (!special.is_boolean() || !pieces.is_boolean()) {
            throw bad_request(special.is_boolean() ? "with_pieces" : "add_special", "must be a boolean");
        }
        json tokens = json::array();
        for (const llama_token t : s_.tokenize(content.get<std::string>(), special.get<bool>())) {
            tokens.push_back(pieces.get<bool>() ? json{ { "id", t }, { "piece", s_.detokenize({ t }) } } : json(t));
        }
        return json{ { "tokens", tokens } };
    });
}

void chat_server::detokenize(const httplib::Request & req, httplib::Response & res) {
    answer_json(req, res, [&](const json & body) {
        const json &  tokens  = body.contains("tokens") ? body["tokens"] : json();
        const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(s_.model()));
        std::vector<llama_token> ids;
        for (const json & t : tokens.is_array() ? tokens : json::array({ nullptr })) {
            if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab) {
                throw bad_request("tokens", "'tokens' must be an array of token ids in [0, " +
                                                std::to_string(n_vocab) + ")");
            }
            ids.push_back(t.get<llama_token>());
        }
        return json{ { "content", s_.detokenize(ids) } };
    });
}

extern const char * const k_chat_page;  // tools/serve/web/index.html, embedded by CMake

void chat_server::page(const httplib::Request &, httplib::Response & res) {
    res.set_content(k_chat_page, "text/html; charset=utf-8");
}

void chat_server::props(const httplib::Request &, httplib::Response & res) {
    const char * tmpl    = llama_model_chat_template(s_.model(), nullptr);
    json         methods = json::array();  // the registry's, as --list-methods prints them
    for (const method_info & m : list_methods()) {
        methods.push_back({ { "name", m.name }, { "kind", m.kind }, { "description", m.description },
                            { "defaults", m.defaults } });
    }
    send_json(res, { { "model_alias", o_.model_name },
                     { "model_path", s_.options().model_path },
                     { "total_slots", o_.slots },
                     { "chat_template", tmpl ? tmpl : "" },
                     { "modalities", { { "vision", s_.has_projector() }, { "audio", false } } },
                     { "default_generation_settings",
                       { { "n_ctx", s_.n_ctx() }, { "max_tokens", o_.limits.max_tokens_default },
                         { "kv_compression", o_.kv.compress ? o_.kv.server.key() : std::string(k_full_cache) } } },
                     { "kv_methods", methods },
                     { "kv_method", o_.kv.server.spec.name() },
                     { "kv_budget", o_.kv.server.params.budget },
                     { "kv_memory", memory_json() } });
}

void chat_server::slots(const httplib::Request &, httplib::Response & res) {
    const auto load  = scheduler_.load_now();
    json       slots = json::array();
    for (size_t i = 0; i < load.each.size(); ++i) {  // each slot's request (or its last), and what it resumed
        const auto & st = load.each[i];
        slots.push_back({ { "id", i },
                          { "n_ctx", s_.n_ctx() },
                          { "is_processing", st.is_processing },
                          { "n_prompt_tokens", st.prompt_cells },
                          { "n_prompt_tokens_cached", st.cached_cells },
                          { "cache_hit", !st.hit                                ? json()
                                         : *st.hit == entry_kind::prefix ? json("prefix")
                                                                         : json("conversation") },
                          { "kv_memory", memory_json() } });
    }
    send_json(res, slots);
}

// The decode loop's memory as /props and /slots show it (null with --no-batch).
json chat_server::memory_json() const {
    if (!loop_) {
        return json();
    }
    const auto l = loop_->load_now();
    return { { "cells", l.n_cells }, { "cells_used", l.cells_promised }, { "kept_rows", l.kept_rows },
             { "kept_rows_used", l.kept_rows_used }, { "sequences", l.live }, { "waiting", l.waiting } };
}

void chat_server::chat_completions(const httplib::Request & req, httplib::Response & res) {
    chat(req, res, &parse_chat_request);
}

void chat_server::completions(const httplib::Request & req, httplib::Response & res) {
    chat(req, res, &parse_completion_request);
}

void chat_server::chat(const httplib::Request & req, httplib::Response & res, request_parser parse) {
    const uint64_t n = ++stats_.requests;
    try {
        const json body = json::parse(req.body, nullptr, false);
        if (body.is_discarded()) {
            throw bad_request("", "the request body is not valid JSON");
        }
        auto r = std::make_shared<chat_request>(parse(body, o_.limits));
        if (!r->model.empty() && r->model != o_.model_name) {
            throw request_error(404, "invalid_request_error", "model",
                                "the model '" + r->model + "' does not exist; this server serves '" + o_.model_name + "'");
        }
        const compression c     = resolve_compression(*r, o_.kv);
        auto              place = scheduler_.admit();
        answer_header     h;
        h.created = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch()).count();
        h.model      = o_.model_name;
        h.id         = "chatcmpl-" + std::to_string(h.created) + "-" + std::to_string(n);
        h.completion = r->prompt_text.has_value();
        auto t       = scheduler_.begin(*place, *r, c);
        if (loop_ && decodes_in_loop(c, s_) && loop_->could_fit(t->kept->snap, r->max_tokens)) {
            // its own context freed, the answer decodes with the others' (one that never fits the loop's memory
            // decodes alone, as with --no-batch; so does a state the pool refuses: a full cache whose V a device
            // without flash attention transposed); with nothing else running, solo until something does
            if (loop_->begin_solo()) {
                t->solo.emplace(*loop_);
            } else {
                try {
                    t->seat.emplace(*loop_, loop_->enter(t->kept->snap, r->max_tokens));
                    t->logits = t->kept->snap.logits;
                    t->seq.reset();
                } catch (const ecokv::error &) {
                }
            }
        }
        if (loop_ && !t->seat && !t->solo) {
            ++stats_.decoded_alone;
        }
        res.set_chunked_content_provider(r->stream ? "text/event-stream" : "application/json",
                                         [this, t, r, h, place](size_t, httplib::DataSink & sink) {
                                             generate(*t, *r, h, sink);
                                             sink.done();
                                             return true;
                                         });
    } catch (const request_error & e) {
        ++stats_.errors;
        res.status = e.status;
        send_json(res, error_body(e));
    } catch (const std::exception & e) {
        ++stats_.errors;
        res.status = 500;
        send_json(res, error_body(request_error(500, "server_error", "", e.what())));
    }
}

}  // namespace ecokv::serve
