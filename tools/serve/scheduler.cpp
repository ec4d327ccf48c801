#include "scheduler.h"

#include "ecokv/error.h"

#include <algorithm>
#include <chrono>
#include <functional>

namespace ecokv::serve {

namespace el = ecokv::llama;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The cache key of a prompt: one unit naming the compression, then the prompt's units.
std::vector<uint64_t> keyed(const std::string & config, const std::vector<uint64_t> & units) {
    std::vector<uint64_t> key{ std::hash<std::string>{}(config) | (uint64_t(1) << 62) };
    key.insert(key.end(), units.begin(), units.end());
    return key;
}

// The text of the last user message replaced by a marker: the chat text before it is the part of the prompt that is
// compressed before the question is known (as `ecokv run --question`).
std::string before_question(const el::session & s, std::vector<el::chat_message> messages, const std::string & mark) {
    std::string &     content = messages.back().content;
    const std::string marker  = el::media_marker();
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

// The conversation a sequence holds, with the units of its cells.
std::shared_ptr<cached_conversation> conversation(const el::sequence & seq, std::vector<uint64_t> units,
                                                  int32_t n_cells) {
    auto kept        = std::make_shared<cached_conversation>();
    kept->units      = std::move(units);
    kept->snap       = seq.save();
    kept->full_bytes = seq.kv_bytes_of_cells(n_cells);
    return kept;
}

}  // namespace

struct scheduler::place {
    scheduler & sched;
    explicit place(scheduler & s) : sched(s) {}
    place(const place &) = delete;
    ~place() {
        {
            const std::lock_guard<std::mutex> lock(sched.mutex_);
            --sched.busy_;
        }
        sched.free_.notify_one();
    }
};

scheduler::scheduler(const el::session & s, cache_tier & cache, serve_stats & stats, int32_t slots, int32_t queue) :
    s_(s), cache_(cache), stats_(stats), slots_(slots), queue_(queue) {}

std::shared_ptr<scheduler::place> scheduler::admit() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (busy_ >= slots_) {
        if (waiting_ >= queue_) {
            ++stats_.rejected;
            throw request_error(503, "server_busy", "", "every slot and the queue are full; retry later");
        }
        ++waiting_;
        free_.wait(lock, [&] { return busy_ < slots_; });
        --waiting_;
    }
    ++busy_;
    return std::shared_ptr<place>(new place(*this));  // no temporary: its destructor would free a slot
}

scheduler::load scheduler::load_now() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return { slots_, busy_, waiting_ };
}

std::shared_ptr<turn> scheduler::begin(const chat_request & r, const compression & c) {
    auto                      t = std::make_shared<turn>();
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
    t->key         = keyed(c.key(), units);
    const auto t0  = std::chrono::steady_clock::now();
    const auto hit = cache_.find(t->key);
    if (hit) {  // continue the kept conversation: only the units after it are prefilled
        const size_t from = hit->units.size() - 1;
        t->cached_cells   = p->cells_before(from);
        t->seq.emplace(s_.resume(hit->snap, c, t->prompt_cells - t->cached_cells + r.max_tokens));
        t->seq->append(*p, from);
        ++stats_.hits;
    } else {  // what comes before the question is compressed first (a completion's whole prompt, as ecokv run's)
        size_t split = units.size();
        if (c.enabled && !r.prompt_text) {
            const el::prompt before =
                s_.make_prompt_from_memory(before_question(s_, r.messages, "\x01" "ECOKV" "\x01"), r.images);
            split = std::mismatch(before.units().begin(), before.units().end(), units.begin(), units.end()).first -
                    before.units().begin();
        }
        t->seq.emplace(s_.prefill(*p, c, r.max_tokens, split));
        t->seq->append(*p, split);
        ++stats_.misses;
    }
    t->prefill_s = seconds_since(t0);
    stats_.prefill_us += uint64_t(t->prefill_s * 1e6);
    stats_.prompt_tokens += uint64_t(t->prompt_cells);
    stats_.cached_tokens += uint64_t(t->cached_cells);
    auto kept = conversation(*t->seq, t->key, t->prompt_cells);
    cache_.put(kept, hit.get());
    t->kept = std::move(kept);
    return t;
}

std::shared_ptr<const cached_conversation> scheduler::finish(turn & t, const std::vector<llama_token> & decoded) {
    bool keep = true;
    try {
        t.seq->end_turn();
    } catch (const std::exception &) {  // the answer still goes out; the conversation is not kept
        ++stats_.errors;
        keep = false;
    }
    std::vector<uint64_t> units = t.key;
    units.insert(units.end(), decoded.begin(), decoded.end());
    auto kept = conversation(*t.seq, std::move(units), t.prompt_cells + int32_t(decoded.size()));
    if (keep) {
        cache_.put(kept, t.kept.get());
    }
    return kept;
}

}  // namespace ecokv::serve
