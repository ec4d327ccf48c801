// ecokv serve: a turn's answer, token by token: picked greedily or sampled, cut at stop strings, streamed as it is
// ready (server-sent events) or sent whole, then the conversation kept by the scheduler.
#include "server.h"

#include "common/json-text.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
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

// What a turn holds after its answer, from its sequence or, in the decode loop, from the state it left with.
struct held_figures {
    uint64_t bytes_kept = 0, bytes_allocated = 0, bytes_full = 0;  // KV bytes
    int32_t  entries = 0, recompressions = 0, n_decoded = 0;
    const std::vector<std::vector<int32_t>> * kept_cells = nullptr;
};

held_figures held(const turn & t, const el::snapshot & snap, int32_t n_cells,
                  const std::function<uint64_t(int32_t)> & of_cells) {
    held_figures h;
    // the kept entries of a compressed prefix and every cell stored since, or its cells
    h.bytes_kept = snap.layout.empty() ? of_cells(snap.n_cells) : snap.kv_bytes_kept + of_cells(snap.n_cells - 1);
    h.bytes_full = of_cells(n_cells);
    if (t.seq) {
        h.bytes_allocated = t.seq->kv_bytes_allocated();
        h.entries         = t.seq->n_held();
        h.recompressions  = t.seq->n_recompressions();
        h.n_decoded       = t.seq->n_decoded();
        h.kept_cells      = &t.seq->kept_cells();
    } else {  // a seat of the pool holds what it keeps
        h.bytes_allocated = h.bytes_kept;
        h.entries   = snap.layout.empty() ? snap.n_cells
                                          : int32_t(*std::max_element(snap.layout.begin(), snap.layout.end())) + snap.n_cells - 1;
        h.n_decoded = int32_t(snap.decoded_modality.size());
        h.kept_cells = &snap.kept_cells;
    }
    return h;
}

}  // namespace

void chat_server::generate(turn & t, const chat_request & r, const answer_header & h, httplib::DataSink & sink) {
    std::mt19937_64 rng(r.has_seed ? r.seed : std::random_device{}());
    auto            send = [&](const std::string & s) { return sink.write(s.data(), s.size()); };
    auto            event = [&](const json & j) { return send("data: " + json_text(j) + "\n\n"); };
    // A streamed piece of text, with the log-probabilities of the tokens since the last piece when asked.
    json logprobs = json::array(), pending = json::array();  // every step's entry; those not streamed yet
    auto content_chunk = [&](const std::string & piece) {
        json c = stream_chunk(h, { { "content", piece } }, nullptr);
        if (r.logprobs) {
            c["choices"][0]["logprobs"] = { { "content", pending } };
            pending                     = json::array();
        }
        return c;
    };
    if (r.stream && !h.completion && !event(stream_chunk(h, { { "role", "assistant" }, { "content", "" } }, nullptr))) {
        ++stats_.cancelled;
        return;
    }
    std::vector<llama_token> out;
    std::string              text, finish = "length";
    size_t                   sent = 0, n_decoded = 0;
    bool                     alive = true;
    const auto               t0    = clock_type::now();
    std::vector<llama_token> eog;  // with ignore_eos: the tokens never picked
    std::vector<float>       masked;
    // the turn's sequence, or its seat in the decode loop
    const auto next_logits = [&]() -> const std::vector<float> & { return t.seat ? t.logits : t.seq->logits(); };
    for (llama_token v = 0; r.ignore_eos && v < llama_token(next_logits().size()); ++v) {
        if (s_.is_end_of_generation(v)) {
            eog.push_back(v);
        }
    }
    try {
        for (int32_t i = 0; i < r.max_tokens && alive; ++i) {
            const std::vector<float> * logits = &next_logits();
            if (!eog.empty()) {
                masked = *logits;
                for (const llama_token v : eog) {
                    masked[size_t(v)] = -INFINITY;
                }
                logits = &masked;
            }
            const llama_token tok = el::pick_token(*logits, r.temperature, rng);
            if (s_.is_end_of_generation(tok)) {
                finish = "stop";
                break;
            }
            if (r.logprobs) {
                const json e = logprob_entry(s_, next_logits(), tok, r.top_logprobs);
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
            alive = ready > sent && r.stream ? event(content_chunk(text.substr(sent, ready - sent))) : send(" ");
            sent  = std::max(sent, ready);
            if (finish == "stop") {
                break;
            }
            if (i + 1 < r.max_tokens && alive) {
                decode_next(t, tok, r.max_tokens - i);
                ++n_decoded;
            }
        }
    } catch (const std::exception & e) {  // the status is sent already: report in the body
        t.solo.reset();
        const json err = error_body(request_error(500, "server_error", "", e.what()));
        r.stream ? event(err) : send(json_text(err));
        ++stats_.errors;
        return;
    }
    if (t.solo) {
        stats_.solo += alive ? 1 : 0;
        t.solo.reset();  // its turn ends (on this thread, if still alone)
    }
    stats_.decode_us += uint64_t(seconds_since(t0) * 1e6);
    stats_.completion_tokens += out.size();
    if (!alive) {
        ++stats_.cancelled;
        return;
    }
    const std::vector<llama_token> decoded(out.begin(), out.begin() + ptrdiff_t(n_decoded));
    const auto                     kept = scheduler_.finish(t, decoded);  // the conversation, for the next turn
    const auto of_cells = [&](int32_t n) { return t.seq ? t.seq->kv_bytes_of_cells(n) : loop_->kv_bytes_of_cells(n); };
    const held_figures             f = held(t, kept->snap, t.prompt_cells + int32_t(out.size()), of_cells);
    usage_figures                  u;
    u.prompt_cells       = t.prompt_cells;
    u.cached_cells       = t.cached_cells;
    u.completion_tokens  = int32_t(out.size());
    u.kv_bytes_kept      = f.bytes_kept;
    u.kv_bytes_allocated = f.bytes_allocated;
    u.kv_entries_held    = f.entries;
    u.kv_recompressions  = f.recompressions;
    u.kv_bytes_full      = f.bytes_full;
    const json usage     = usage_json(u);
    const json kv_kept   = t.cells ? kept_json(s_, *f.kept_cells, f.n_decoded, *t.cells, decoded, u.kv_bytes_kept,
                                               of_cells(int32_t(t.cells->pieces.size() + decoded.size())))
                                   : json();
    if (r.stream) {
        if (sent < text.size() || !pending.empty()) {
            event(content_chunk(text.substr(sent)));
        }
        json last = stream_chunk(h, json::object(), finish);
        if (!kv_kept.is_null()) {
            last["kv_kept"] = kv_kept;
        }
        event(last);
        if (r.include_usage) {  // as OpenAI: one more chunk, with no choices, carrying the usage
            event(usage_chunk(h, usage));
        }
        send("data: [DONE]\n\n");
        return;
    }
    json body = answer_body(h, text, finish, r.logprobs ? logprobs : json(), usage);
    if (!kv_kept.is_null()) {
        body["kv_kept"] = kv_kept;
    }
    send(json_text(body));
}

// The turn's next token decoded: with the other seats' in the loop; solo on this thread while nothing else runs,
// entering the loop when something does (n_new: cells it may still need); else alone on the engine.
void chat_server::decode_next(turn & t, llama_token tok, int32_t n_new) {
    if (t.solo) {
        if (t.solo->decode([&] { t.seq->decode({ tok }); })) {
            return;
        }
        t.solo.reset();
        try {
            t.seat.emplace(*loop_, loop_->enter(t.seq->save(), n_new));
            t.seq.reset();
            ++stats_.solo_joined;
        } catch (const std::exception &) {  // the loop is full or refuses it: the answer goes on alone
            ++stats_.decoded_alone;
        }
    }
    if (t.seat) {
        t.logits = t.seat->next(tok);  // with every other seat's next token
    } else {
        scheduler_.on_engine([&] { t.seq->decode({ tok }); });  // compressed again first when due
    }
}

}  // namespace ecokv::serve
