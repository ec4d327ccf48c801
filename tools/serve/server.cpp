#include "server.h"

#include "connections.h"
#include "common/json-text.h"

#include "ecokv/error.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <optional>
#include <random>

namespace ecokv::serve {

using json = nlohmann::json;
using ecokv::tools::json_text;
namespace el = ecokv::llama;

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// The cache key of a prompt: one unit naming the compression, then the prompt's units.
std::vector<uint64_t> keyed(const std::string & config, const std::vector<uint64_t> & units) {
    std::vector<uint64_t> key{ std::hash<std::string>{}(config) | (uint64_t(1) << 62) };
    key.insert(key.end(), units.begin(), units.end());
    return key;
}

// The number of bytes at the end of `s` that may start a stop string or an unfinished UTF-8 character: they wait
// for the next token before they are sent.
size_t held_back(const std::string & s, const std::vector<std::string> & stop) {
    size_t hold = 0;
    for (const std::string & st : stop) {
        for (size_t n = std::min(st.size() - 1, s.size()); n > hold; --n) {
            if (s.compare(s.size() - n, n, st, 0, n) == 0) {
                hold = n;
                break;
            }
        }
    }
    for (size_t n = 1; n <= std::min<size_t>(3, s.size()); ++n) {  // a lead byte whose sequence is not complete
        const uint8_t c    = uint8_t(s[s.size() - n]);
        const size_t  need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
        if (need > n) {
            hold = std::max(hold, n);
            break;
        }
        if ((c & 0xC0) != 0x80) {
            break;
        }
    }
    return hold;
}

// KV bytes a conversation holds: the kept entries of its compressed prefix and every cell stored since, or its cells.
uint64_t held_bytes(const el::sequence & seq, const el::snapshot & snap) {
    return snap.layout.empty() ? seq.kv_bytes_of_cells(snap.n_cells)
                               : seq.kv_bytes_kept() + seq.kv_bytes_of_cells(snap.n_cells - 1);
}

llama_token pick(const std::vector<float> & logits, double temperature, std::mt19937_64 & rng) {
    if (temperature <= 0) {
        return el::argmax(logits);
    }
    const float        top = *std::max_element(logits.begin(), logits.end());
    std::vector<double> w(logits.size());
    for (size_t i = 0; i < w.size(); ++i) {
        w[i] = std::exp((double(logits[i]) - top) / temperature);
    }
    return llama_token(std::discrete_distribution<size_t>(w.begin(), w.end())(rng));
}

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

// OpenAI's logprobs entry of the token chosen at one step, with the n most likely tokens, from the step's logits.
json logprob_entry(const el::session & s, const std::vector<float> & logits, llama_token chosen, int32_t n_top) {
    const float top = *std::max_element(logits.begin(), logits.end());
    double      sum = 0;
    for (const float l : logits) {
        sum += std::exp(double(l) - top);
    }
    const double log_z = double(top) + std::log(sum);
    const auto   token = [&](llama_token t) {
        const std::string piece = s.detokenize({ t });
        return json{ { "token", piece }, { "logprob", double(logits[size_t(t)]) - log_z },
                     { "bytes", std::vector<uint8_t>(piece.begin(), piece.end()) } };
    };
    std::vector<llama_token> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    const size_t n = std::min(size_t(n_top), order.size());
    std::partial_sort(order.begin(), order.begin() + ptrdiff_t(n), order.end(),
                      [&](llama_token a, llama_token b) { return logits[size_t(a)] > logits[size_t(b)]; });
    json entry            = token(chosen);
    entry["top_logprobs"] = json::array();
    for (size_t i = 0; i < n; ++i) {
        entry["top_logprobs"].push_back(token(order[i]));
    }
    return entry;
}

// The text of the last user message replaced by a marker: the chat text before it is the part of the prompt that is
// compressed before the question is known (as `ecokv run --question`).
std::string before_question(const el::session & s, std::vector<el::chat_message> messages, const std::string & mark) {
    std::string &     content = messages.back().content;
    const std::string marker  = llama::media_marker();
    size_t            at      = 0;
    while (content.compare(at, marker.size(), marker) == 0) {
        at += marker.size();
        at += at < content.size() && content[at] == '\n';
    }
    content = content.substr(0, at) + mark;
    const std::string text = s.chat_text(messages);
    const size_t      pos  = text.find(mark);
    return pos == std::string::npos ? std::string() : text.substr(0, pos);
}

}  // namespace

struct chat_server::stats {
    std::atomic<uint64_t> requests{ 0 }, errors{ 0 }, rejected{ 0 }, cancelled{ 0 };
    std::atomic<uint64_t> prompt_tokens{ 0 }, cached_tokens{ 0 }, completion_tokens{ 0 }, hits{ 0 }, misses{ 0 };
    std::atomic<uint64_t> prefill_us{ 0 }, decode_us{ 0 };
};

struct chat_server::slot_guard {
    chat_server & srv;
    explicit slot_guard(chat_server & s) : srv(s) {}
    slot_guard(const slot_guard &) = delete;
    ~slot_guard() {
        {
            const std::lock_guard<std::mutex> lock(srv.slot_mutex_);
            --srv.busy_;
        }
        srv.slot_free_.notify_one();
    }
};

// One answer in the making: the sequence after the prompt, what was reused, and the conversation to keep.
struct chat_server::turn {
    std::optional<el::sequence>                seq;
    chat_request                               req;
    std::vector<uint64_t>                      key;
    std::shared_ptr<const cached_conversation> kept;
    compression                                how;
    int32_t                                    prompt_cells = 0, cached_cells = 0;
    int32_t                                    turn_cells   = 0;  // this request's cells decoded so far (its message)
    double                                     prefill_s    = 0;
    std::string                                id, model;
    int64_t                                    created = 0;
};

chat_server::chat_server(const el::session & s, serve_options o) :
    s_(s),
    o_(std::move(o)),
    http_(std::make_unique<httplib::Server>()),
    cache_(o_.cache_bytes),
    stats_(std::make_unique<stats>()) {
    routes();
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

std::string chat_server::metrics() const {
    const auto   t   = cache_.totals_now();
    const auto & st  = *stats_;
    std::string  out;
    auto         add = [&](const char * name, const char * type, const char * help, double v) {
        out += std::string("# HELP ecokv_") + name + " " + help + "\n# TYPE ecokv_" + name + " " + type + "\n";
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.6g", v);
        out += std::string("ecokv_") + name + " " + buf + "\n";
    };
    const double prefill_s = double(st.prefill_us) / 1e6, decode_s = double(st.decode_us) / 1e6;
    const double prefilled = double(st.prompt_tokens) - double(st.cached_tokens);
    add("requests_total", "counter", "chat completion requests", double(st.requests));
    add("request_errors_total", "counter", "requests answered with an error", double(st.errors));
    add("requests_rejected_total", "counter", "requests refused because every slot and the queue were full",
        double(st.rejected));
    add("requests_cancelled_total", "counter", "generations stopped because the client went away",
        double(st.cancelled));
    add("prompt_tokens_total", "counter", "prompt cells of all requests", double(st.prompt_tokens));
    add("prompt_tokens_cached_total", "counter", "prompt cells served from kept conversations",
        double(st.cached_tokens));
    add("completion_tokens_total", "counter", "generated tokens", double(st.completion_tokens));
    add("cache_hits_total", "counter", "requests that continued a kept conversation", double(st.hits));
    add("cache_misses_total", "counter", "requests prefilled from the start", double(st.misses));
    add("prefill_tokens_per_second", "gauge", "prefilled cells per second of prefill, all requests",
        prefill_s > 0 ? prefilled / prefill_s : 0);
    add("decode_tokens_per_second", "gauge", "generated tokens per second of decoding, all requests",
        decode_s > 0 ? double(st.completion_tokens) / decode_s : 0);
    add("kv_cache_conversations", "gauge", "conversations kept", double(t.conversations));
    add("kv_cache_bytes", "gauge", "bytes of the kept conversations (compressed caches)", double(t.bytes));
    add("kv_cache_full_bytes", "gauge", "bytes the kept conversations would take as full caches",
        double(t.full_bytes));
    add("kv_cache_evictions_total", "counter", "conversations evicted to stay within --cache-mib",
        double(t.evictions));
    std::unique_lock<std::mutex> lock(slot_mutex_);
    if (const connection_pool * pool = connections_) {
        const auto c = pool->totals_now();
        add("connections_open", "gauge", "HTTP connections open", double(c.open));
        add("connections_refused_total", "counter", "connections refused past --max-connections", double(c.refused));
        add("connections_timed_out_total", "counter",
            "connections closed for not sending their request within --request-timeout", double(c.timed_out));
    }
    add("slots_busy", "gauge", "requests generating now", double(busy_));
    add("requests_waiting", "gauge", "requests waiting for a slot", double(waiting_));
    return out;
}

void chat_server::routes() {
    httplib::Server & h   = *http_;
    h.new_task_queue = [this] {  // a thread per connection, a cap, a deadline for each request to arrive
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

    // Every handler runs once its request's body is read: the connection's deadline stops there.
    const auto received = [](httplib::Server::Handler f) {
        return [f = std::move(f)](const httplib::Request & req, httplib::Response & res) {
            connection_pool::request_received();
            f(req, res);
        };
    };
    const auto get  = [&](const char * path, httplib::Server::Handler f) { h.Get(path, received(std::move(f))); };
    const auto post = [&](const char * path, httplib::Server::Handler f) { h.Post(path, received(std::move(f))); };
    if (!o_.api_key.empty()) {  // OpenAI's 401 for a missing or wrong key; /health stays open for load balancers
        h.set_pre_routing_handler([this](const httplib::Request & req, httplib::Response & res) {
            if (req.path == "/health" || same_secret(req.get_header_value("Authorization"), "Bearer " + o_.api_key)) {
                return httplib::Server::HandlerResponse::Unhandled;
            }
            ++stats_->errors;
            res.status = 401;
            json body  = error_body(request_error(401, "invalid_request_error", "",
                                                  "Incorrect or missing API key: send 'Authorization: Bearer <key>'"));
            body["error"]["code"] = "invalid_api_key";
            res.set_content(json_text(body), "application/json");
            return httplib::Server::HandlerResponse::Handled;
        });
    }
    get("/health", [](const httplib::Request &, httplib::Response & res) {
        res.set_content(R"({"status":"ok"})", "application/json");
    });
    get("/v1/models", [this](const httplib::Request &, httplib::Response & res) {
        const json body = { { "object", "list" },
                            { "data", json::array({ { { "id", o_.model_name },
                                                      { "object", "model" },
                                                      { "created", 0 },
                                                      { "owned_by", "ecokv" } } }) } };
        res.set_content(json_text(body), "application/json");
    });
    get("/metrics", [this](const httplib::Request &, httplib::Response & res) {
        res.set_content(metrics(), "text/plain; version=0.0.4");
    });
    post("/tokenize", [this](const httplib::Request & req, httplib::Response & res) {
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
    });
    post("/detokenize", [this](const httplib::Request & req, httplib::Response & res) {
        answer_json(req, res, [&](const json & body) {
            const json & tokens = body.contains("tokens") ? body["tokens"] : json();
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
    });
    get("/props", [this](const httplib::Request &, httplib::Response & res) {
        const char * tmpl = llama_model_chat_template(s_.model(), nullptr);
        const json body = { { "model_alias", o_.model_name },
                            { "model_path", s_.options().model_path },
                            { "total_slots", o_.slots },
                            { "chat_template", tmpl ? tmpl : "" },
                            { "modalities", { { "vision", s_.has_projector() }, { "audio", false } } },
                            { "default_generation_settings",
                              { { "n_ctx", s_.n_ctx() }, { "max_tokens", o_.limits.max_tokens_default },
                                { "kv_compression", o_.kv.compress ? o_.kv.server.key() : std::string(k_full_cache) } } } };
        res.set_content(json_text(body), "application/json");
    });
    get("/slots", [this](const httplib::Request &, httplib::Response & res) {
        std::unique_lock<std::mutex> lock(slot_mutex_);
        json                         slots = json::array();
        for (int32_t i = 0; i < o_.slots; ++i) {  // slots are places in the concurrency limit: busy ones first
            slots.push_back({ { "id", i }, { "n_ctx", s_.n_ctx() }, { "is_processing", i < busy_ } });
        }
        res.set_content(json_text(slots), "application/json");
    });
    for (const auto & route : { std::pair{ "/v1/chat/completions", &parse_chat_request },
                                std::pair{ "/v1/completions", &parse_completion_request } }) {
        const request_parser parse = route.second;  // not a structured binding: clang 14 cannot capture those
        post(route.first, [this, parse](const httplib::Request & req, httplib::Response & res) {
            ++stats_->requests;
            try {
                chat(req, res, parse);
            } catch (const request_error & e) {
                ++stats_->errors;
                res.status = e.status;
                res.set_content(json_text(error_body(e)), "application/json");
            } catch (const std::exception & e) {
                ++stats_->errors;
                res.status = 500;
                res.set_content(json_text(error_body(request_error(500, "server_error", "", e.what()))), "application/json");
            }
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
            res.set_content(json_text(error_body(e)), "application/json");
        }
    });
}

std::shared_ptr<chat_server::slot_guard> chat_server::acquire() {
    std::unique_lock<std::mutex> lock(slot_mutex_);
    if (busy_ >= o_.slots) {
        if (waiting_ >= o_.queue) {
            ++stats_->rejected;
            throw request_error(503, "server_busy", "", "every slot and the queue are full; retry later");
        }
        ++waiting_;
        slot_free_.wait(lock, [&] { return busy_ < o_.slots; });
        --waiting_;
    }
    ++busy_;
    return std::shared_ptr<slot_guard>(new slot_guard(*this));  // no temporary: its destructor would free a slot
}

void chat_server::chat(const httplib::Request & req, httplib::Response & res, request_parser parse) {
    const json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded()) {
        throw bad_request("", "the request body is not valid JSON");
    }
    chat_request r = parse(body, o_.limits);
    if (!r.model.empty() && r.model != o_.model_name) {
        throw request_error(404, "invalid_request_error", "model",
                            "the model '" + r.model + "' does not exist; this server serves '" + o_.model_name + "'");
    }
    const compression c    = resolve_compression(r, o_.kv);
    auto              slot = acquire();
    auto              t    = prepare(std::move(r), c);
    const bool        sse  = t->req.stream;
    res.set_chunked_content_provider(sse ? "text/event-stream" : "application/json",
                                     [this, t, slot](size_t, httplib::DataSink & sink) {
                                         generate(*t, sink);
                                         sink.done();
                                         return true;
                                     });
}

std::shared_ptr<chat_server::turn> chat_server::prepare(chat_request r, const compression & c) {
    auto t     = std::make_shared<turn>();
    t->created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    t->model   = o_.model_name;
    t->id      = "chatcmpl-" + std::to_string(t->created) + "-" + std::to_string(stats_->requests.load());
    std::optional<el::prompt> p;
    try {
        p.emplace(s_.make_prompt_from_memory(r.prompt_text ? *r.prompt_text : s_.chat_text(r.messages), r.images));
    } catch (const ecokv::error & e) {
        throw bad_request(r.prompt_text ? "prompt" : "messages", e.what());
    }
    const std::vector<uint64_t> & units = p->units();
    t->prompt_cells                     = p->n_cells();
    if (int64_t(t->prompt_cells) + r.max_tokens > s_.n_ctx()) {
        throw request_error(400, "invalid_request_error", r.prompt_text ? "prompt" : "messages",
                            "the prompt (" + std::to_string(t->prompt_cells) + " tokens) plus max_tokens (" +
                                std::to_string(r.max_tokens) + ") exceeds the context of " +
                                std::to_string(s_.n_ctx()));
    }
    t->key                 = keyed(c.key(), units);
    const auto         t0  = clock_type::now();
    const auto         hit = cache_.find(t->key);
    // A compressed conversation that compresses again (decode_compress, recompress_slack) records its window's queries.
    const bool                again  = c.enabled && (c.decode_compress > 0 || c.recompress_slack >= 0);
    const method_requirements record = again ? requirements(c.spec, c.params) : method_requirements{};
    const int32_t             n_window = record.n_window_queries;
    if (hit) {  // continue the kept conversation: only the units after it are prefilled
        const size_t from = hit->units.size() - 1;
        t->cached_cells   = p->cells_before(from);
        t->turn_cells     = t->prompt_cells - t->cached_cells;
        t->seq.emplace(s_.resume(hit->snap, t->turn_cells + r.max_tokens, false,
                                 hit->snap.layout.empty() ? method_requirements{} : record));
        t->seq->append(*p, from);
        ++stats_->hits;
    } else {  // prefill what comes before the question, compress it, then the question
        size_t split = units.size();
        if (c.enabled && !r.prompt_text) {  // a completion's whole prompt is compressed, as ecokv run's
            const el::prompt before = s_.make_prompt_from_memory(before_question(s_, r.messages, "\x01" "ECOKV" "\x01"), r.images);
            split = std::mismatch(before.units().begin(), before.units().end(), units.begin(), units.end()).first -
                    before.units().begin();
        }
        const int32_t context_cells = p->cells_before(split);
        const int32_t n_extra       = t->prompt_cells - context_cells + r.max_tokens;
        // A conversation that will compress again is held compressed (ragged) from its start, even within the budget.
        const bool    compress      = c.enabled && context_cells > (again ? n_window : c.params.budget);
        t->turn_cells               = t->prompt_cells - context_cells;
        if (compress && c.chunk > 0) {  // the cache never holds more than the budget plus one chunk
            t->seq.emplace(s_.prefill_chunked(*p, c.chunk, c.spec, c.params, n_extra, split));
        } else {
            t->seq.emplace(s_.prefill(*p, n_extra, compress ? requirements(c.spec, c.params) : method_requirements{},
                                      split));
            if (compress) {
                t->seq->compress_in_place(c.spec, c.params);
            }
        }
        if (compress && again) {
            t->seq->record_queries();
        }
        if (split < units.size()) {
            t->seq->append(*p, split);
        }
        ++stats_->misses;
    }
    t->prefill_s = seconds_since(t0);
    stats_->prefill_us += uint64_t(t->prefill_s * 1e6);
    stats_->prompt_tokens += uint64_t(t->prompt_cells);
    stats_->cached_tokens += uint64_t(t->cached_cells);
    auto kept        = std::make_shared<cached_conversation>();
    kept->units      = t->key;
    kept->snap       = t->seq->save();
    kept->full_bytes = t->seq->kv_bytes_of_cells(t->prompt_cells);
    cache_.put(kept, hit.get());
    t->kept = std::move(kept);
    t->req  = std::move(r);
    t->how  = c;
    return t;
}

void chat_server::generate(turn & t, httplib::DataSink & sink) {
    const chat_request & r = t.req;
    std::mt19937_64      rng(r.has_seed ? r.seed : std::random_device{}());
    const bool           completion = r.prompt_text.has_value();
    auto                 chunk = [&](const json & delta, const json & finish) {  // a completion's delta is its text
        json choice = { { "index", 0 }, { "finish_reason", finish } };
        if (completion) {
            choice["text"]     = delta.value("content", "");
            choice["logprobs"] = nullptr;
        } else {
            choice["delta"] = delta;
        }
        return json{ { "id", t.id },       { "object", completion ? "text_completion" : "chat.completion.chunk" },
                     { "created", t.created }, { "model", t.model }, { "choices", json::array({ choice }) } };
    };
    auto send = [&](const std::string & s) { return sink.write(s.data(), s.size()); };
    // A streamed piece of text, with the log-probabilities of the tokens since the last piece when asked.
    json logprobs = json::array(), pending = json::array();  // every step's entry; those not streamed yet
    auto content_chunk = [&](const std::string & piece) {
        json c = chunk({ { "content", piece } }, nullptr);
        if (r.logprobs) {
            c["choices"][0]["logprobs"] = { { "content", pending } };
            pending                     = json::array();
        }
        return json_text(c);
    };
    if (r.stream && !completion &&
        !send("data: " + json_text(chunk({ { "role", "assistant" }, { "content", "" } }, nullptr)) + "\n\n")) {
        ++stats_->cancelled;
        return;
    }
    std::vector<llama_token> out;
    std::string              text, finish = "length";
    size_t                   sent = 0, n_decoded = 0;
    int32_t                  recompressions = 0;
    bool                     alive = true;
    const auto               t0    = clock_type::now();
    try {
        for (int32_t i = 0; i < r.max_tokens && alive; ++i) {
            const llama_token tok = pick(t.seq->logits(), r.temperature, rng);
            if (s_.is_end_of_generation(tok)) {
                finish = "stop";
                break;
            }
            if (r.logprobs) {
                const json e = logprob_entry(s_, t.seq->logits(), tok, r.top_logprobs);
                logprobs.push_back(e);
                pending.push_back(e);
            }
            out.push_back(tok);
            text         = s_.detokenize(out);
            size_t ready = text.size() - held_back(text, r.stop);
            for (const std::string & st : r.stop) {
                if (const size_t at = text.find(st); at != std::string::npos) {
                    text   = text.substr(0, at);
                    ready  = text.size();
                    finish = "stop";
                }
            }
            // Streamed text as it is ready; otherwise a space (JSON allows it) tells a closed connection apart.
            alive = ready > sent && r.stream ? send("data: " + content_chunk(text.substr(sent, ready - sent)) + "\n\n")
                                             : send(" ");
            sent = std::max(sent, ready);
            if (finish == "stop") {
                break;
            }
            if (i + 1 < r.max_tokens && alive) {
                if (t.how.decode_compress > 0 && t.seq->n_decoded() >= t.how.decode_compress &&
                    t.seq->compress_again(t.how.spec, t.how.params, 0, t.how.decode_compress)) {
                    ++recompressions;
                }
                t.seq->decode({ tok });
                ++n_decoded;
            }
        }
    } catch (const std::exception & e) {  // the status is sent already: report in the body
        const json err = error_body(request_error(500, "server_error", "", e.what()));
        send(r.stream ? "data: " + json_text(err) + "\n\n" : json_text(err));
        ++stats_->errors;
        return;
    }
    stats_->decode_us += uint64_t(seconds_since(t0) * 1e6);
    stats_->completion_tokens += out.size();
    if (!alive) {
        ++stats_->cancelled;
        return;
    }
    // The conversation with its answer, for the next turn: compressed again first when it holds more than budget +
    // slack entries besides this turn (docs/conversations.md). Should that fail, the answer still goes out, and the
    // conversation is not kept.
    bool keep = true;
    try {
        if (t.how.enabled && t.how.recompress_slack >= 0 &&
            t.seq->recompress(t.how.spec, t.how.params, t.turn_cells + int32_t(n_decoded), t.how.recompress_slack, 1)) {
            ++recompressions;
        }
    } catch (const std::exception &) {
        ++stats_->errors;
        keep = false;
    }
    auto kept = std::make_shared<cached_conversation>();
    kept->units = t.key;
    kept->units.insert(kept->units.end(), out.begin(), out.begin() + ptrdiff_t(n_decoded));
    kept->snap       = t.seq->save();
    kept->full_bytes = t.seq->kv_bytes_of_cells(t.prompt_cells + int32_t(n_decoded));
    if (keep) {
        cache_.put(kept, t.kept.get());
    }

    const json usage = {
        { "prompt_tokens", t.prompt_cells },
        { "completion_tokens", out.size() },
        { "total_tokens", t.prompt_cells + int32_t(out.size()) },
        { "prompt_tokens_details", { { "cached_tokens", t.cached_cells } } },
        { "prefilled_tokens", t.prompt_cells - t.cached_cells },
        { "kv_bytes_kept", held_bytes(*t.seq, kept->snap) },
        { "kv_bytes_allocated", t.seq->kv_bytes_allocated() },
        { "kv_entries_held", t.seq->n_held() },
        { "kv_recompressions", recompressions },
        { "kv_bytes_full", t.seq->kv_bytes_of_cells(t.prompt_cells + int32_t(out.size())) },
    };
    if (r.stream) {
        if (sent < text.size() || !pending.empty()) {
            send("data: " + content_chunk(text.substr(sent)) + "\n\n");
        }
        send("data: " + json_text(chunk(json::object(), finish)) + "\n\n");
        if (r.include_usage) {  // as OpenAI: one more chunk, with no choices, carrying the usage
            json last       = chunk(json::object(), nullptr);
            last["choices"] = json::array();
            last["usage"]   = usage;
            send("data: " + json_text(last) + "\n\n");
        }
        send("data: [DONE]\n\n");
        return;
    }
    if (completion) {
        const json body = { { "id", t.id }, { "object", "text_completion" }, { "created", t.created },
                            { "model", t.model },
                            { "choices", json::array({ { { "index", 0 }, { "text", text }, { "logprobs", nullptr },
                                                         { "finish_reason", finish } } }) },
                            { "usage", usage } };
        send(json_text(body));
        return;
    }
    const json body = { { "id", t.id },
                        { "object", "chat.completion" },
                        { "created", t.created },
                        { "model", t.model },
                        { "choices", json::array({ { { "index", 0 },
                                                     { "message", { { "role", "assistant" }, { "content", text } } },
                                                     { "logprobs", r.logprobs ? json{ { "content", logprobs } } : json() },
                                                     { "finish_reason", finish } } }) },
                        { "usage", usage } };
    send(json_text(body));
}

}  // namespace ecokv::serve
