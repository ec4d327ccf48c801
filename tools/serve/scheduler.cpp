#include "scheduler.h"

#include "ecokv/error.h"

#include <algorithm>
#include <chrono>

namespace ecokv::serve {

namespace el = ecokv::llama;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The cache key of a prompt: one unit naming the compression, then the prompt's units.
std::vector<uint64_t> keyed(const std::string & config, const std::vector<uint64_t> & units) {
    std::vector<uint64_t> key{ compression_unit(config) };
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

// The entry of what a sequence holds, with the units of its cells.
std::shared_ptr<cached_conversation> entry(const el::sequence & seq, std::string compression_key,
                                           std::vector<uint64_t> units, int32_t n_cells,
                                           entry_kind kind = entry_kind::conversation) {
    auto kept             = std::make_shared<cached_conversation>();
    kept->compression_key = std::move(compression_key);
    kept->units      = std::move(units);
    kept->snap       = seq.save();
    kept->full_bytes = seq.kv_bytes_of_cells(n_cells);
    kept->kind       = kind;
    return kept;
}

}  // namespace

void scheduler::on_engine(const std::function<void()> & f) const {
    engine_ ? engine_(f) : f();
}

struct scheduler::place {
    scheduler &  sched;
    const size_t id;
    place(scheduler & s, size_t i) : sched(s), id(i) {}
    place(const place &) = delete;
    ~place() {
        if (sched.cores_) {
            sched.cores_->add_user(-1);
        }
        {
            const std::lock_guard<std::mutex> lock(sched.mutex_);
            --sched.busy_;
            sched.slot_states_[id].is_processing = false;
        }
        sched.free_.notify_one();
    }
};

scheduler::scheduler(const el::session & s, cache_tier & cache, serve_stats & stats, int32_t slots, int32_t queue,
                     core_share * cores, engine_runner engine) :
    s_(s), cache_(cache), stats_(stats), slots_(slots), queue_(queue), cores_(cores), engine_(std::move(engine)),
    slot_states_(size_t(slots)) {}

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
    const auto idle = std::find_if(slot_states_.begin(), slot_states_.end(), [](const auto & s) { return !s.is_processing; });
    *idle           = { true, 0, 0, std::nullopt };
    // no temporary: its destructor would free a slot
    if (cores_) {
        cores_->add_user(1);
    }
    return std::shared_ptr<place>(new place(*this, size_t(idle - slot_states_.begin())));
}

scheduler::load scheduler::load_now() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return { slots_, busy_, waiting_, slot_states_ };
}

std::shared_ptr<turn> scheduler::begin(const place & at, const chat_request & r, const compression & c) {
    auto                      t = std::make_shared<turn>();
    std::optional<el::prompt> p;
    try {
        p.emplace(s_.make_prompt_from_memory(r.prompt_text ? *r.prompt_text : s_.chat_text(r.messages), r.images));
    } catch (const ecokv::error & e) {
        throw bad_request(r.prompt_text ? "prompt" : "messages", e.what());
    }
    const std::vector<uint64_t> & units = p->units();
    t->prompt_cells                     = p->n_cells();
    if (r.kv_kept) {
        t->cells = describe_cells(s_, *p);
    }
    if (int64_t(t->prompt_cells) + r.max_tokens > s_.n_ctx()) {
        throw request_error(400, "invalid_request_error", r.prompt_text ? "prompt" : "messages",
                            "the prompt (" + std::to_string(t->prompt_cells) + " tokens) plus max_tokens (" +
                                std::to_string(r.max_tokens) + ") exceeds the context of " +
                                std::to_string(s_.n_ctx()));
    }
    t->key = keyed(c.key(), units);
    // Where the question starts: the units before the last user message's text (a completion's whole prompt).
    std::optional<size_t> split;
    const auto            context_end = [&] {
        if (!split) {
            split = units.size();
            if (!r.prompt_text) {
                const el::prompt before =
                    s_.make_prompt_from_memory(before_question(s_, r.messages, "\x01" "ECOKV" "\x01"), r.images);
                split = size_t(std::mismatch(before.units().begin(), before.units().end(), units.begin(), units.end())
                                   .first - before.units().begin());
            }
        }
        return *split;
    };
    on_engine([&] { prefill(*t, *p, r, c, context_end); });
    const std::lock_guard<std::mutex> lock(mutex_);
    slot_states_[at.id] = { true, t->prompt_cells, t->cached_cells, t->hit };
    return t;
}

// begin()'s work on the engine: the longest kept entry resumed, or the context prefilled and kept, then the rest.
void scheduler::prefill(turn & t, const el::prompt & prompt, const chat_request & r, const compression & c,
                        const std::function<size_t()> & context_end) {
    const el::prompt &            p     = prompt;
    const std::vector<uint64_t> & units = p.units();
    const auto                    t0    = std::chrono::steady_clock::now();
    auto hit = cache_.find(t.key);
    // A kept context serves a request with this very context (its own would be compressed whole), or any full cache.
    if (hit && hit->kind == entry_kind::prefix && c.enabled && hit->units.size() - 1 != context_end()) {
        hit = nullptr;
    }
    if (hit) {  // a kept context or conversation the prompt starts with: only the units after it are prefilled
        const size_t from = hit->units.size() - 1;
        t.cached_cells   = p.cells_before(from);
        t.seq.emplace(s_.resume(hit->snap, c, t.prompt_cells - t.cached_cells + r.max_tokens));
        t.seq->append(p, from);
        t.hit = hit->kind;
        ++(hit->kind == entry_kind::prefix ? stats_.prefix_hits : stats_.hits);
    } else {  // the context prefilled (compressed) first and kept on its own for any request about it, then the rest
        const size_t at = context_end();
        t.seq.emplace(s_.prefill(p, c, r.max_tokens, at));
        if (at > 0 && at < units.size()) {
            cache_.put(entry(*t.seq, c.key(), keyed(c.key(), { units.begin(), units.begin() + ptrdiff_t(at) }),
                             p.cells_before(at), entry_kind::prefix));
        }
        t.seq->append(p, at);
        ++stats_.misses;
    }
    t.prefill_s = seconds_since(t0);
    stats_.prefill_us += uint64_t(t.prefill_s * 1e6);
    stats_.prompt_tokens += uint64_t(t.prompt_cells);
    stats_.cached_tokens += uint64_t(t.cached_cells);
    auto kept    = entry(*t.seq, c.key(), t.key, t.prompt_cells);
    kept->shared = false;  // finish() replaces it
    cache_.put(kept, hit && hit->kind == entry_kind::conversation ? hit.get() : nullptr);  // a context stays for others
    t.kept = std::move(kept);
}

std::shared_ptr<const cached_conversation> scheduler::finish(turn & t, const std::vector<llama_token> & decoded) {
    std::vector<uint64_t> units = t.key;
    units.insert(units.end(), decoded.begin(), decoded.end());
    if (t.seat) {  // its state leaves the decode loop as the conversation kept
        auto kept             = std::make_shared<cached_conversation>();
        kept->compression_key = t.kept->compression_key;
        kept->units           = std::move(units);
        kept->full_bytes      = t.seat->kv_bytes_of_cells(t.prompt_cells + int32_t(decoded.size()));
        kept->snap            = t.seat->leave();
        kept->kind            = entry_kind::conversation;
        t.seat.reset();
        cache_.put(kept, t.kept.get());
        return kept;
    }
    bool keep = true;
    try {
        on_engine([&] { t.seq->end_turn(); });
    } catch (const std::exception &) {  // the answer still goes out; the conversation is not kept
        ++stats_.errors;
        keep = false;
    }
    auto kept = entry(*t.seq, t.kept->compression_key, std::move(units), t.prompt_cells + int32_t(decoded.size()));
    if (keep) {
        cache_.put(kept, t.kept.get());
    }
    return kept;
}

}  // namespace ecokv::serve
