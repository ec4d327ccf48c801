// ecokv serve: admission of requests and the engine side of their turns. A request is admitted while fewer than
// --slots run (else it waits, among at most --queue others, else 503). Its turn's sequence, one llama.cpp context made
// by the session, is resumed from a kept conversation or prefilled with the request's compression; at the end the
// conversation with its answer is kept for the next turn. The one place that decides what runs and what it holds.
#pragma once

#include "cache-tier.h"
#include "chat-request.h"
#include "core-share.h"
#include "decode-loop.h"
#include "kept-view.h"

#include "ecokv/llama-session.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace ecokv::serve {

// What /metrics counts: requests and tokens (the server's), cache hits and prefills (the scheduler's).
struct serve_stats {
    std::atomic<uint64_t> requests{ 0 }, errors{ 0 }, rejected{ 0 }, cancelled{ 0 };
    std::atomic<uint64_t> prompt_tokens{ 0 }, cached_tokens{ 0 }, completion_tokens{ 0 }, misses{ 0 };
    std::atomic<uint64_t> hits{ 0 }, prefix_hits{ 0 };  // requests that resumed a conversation, a kept context
    std::atomic<uint64_t> prefill_us{ 0 }, decode_us{ 0 };
    std::atomic<uint64_t> solo{ 0 };           // answers decoded solo from start to end: the loop idle meanwhile
    std::atomic<uint64_t> solo_joined{ 0 };    // answers begun solo that entered the loop when another request came
    std::atomic<uint64_t> decoded_alone{ 0 };  // with the decode loop: answers decoded in a context of their own
};

// One answer in the making: the sequence after the prompt, what was reused, and the conversation kept.
struct turn {
    std::optional<llama::sequence>             seq;
    std::vector<uint64_t>                      key;   // the compression's unit, then the prompt's units
    std::shared_ptr<const cached_conversation> kept;  // the conversation as kept after the prompt
    int32_t                                    prompt_cells = 0, cached_cells = 0;
    double                                     prefill_s    = 0;
    std::optional<entry_kind>                  hit;  // what it resumed, or nothing (prefilled from the start)
    std::optional<cell_map>                    cells;   // the prompt's cells, when the request asks for kv_kept
    std::optional<pool_seat>                   seat;    // decoding in the server's decode loop (seq then empty)
    std::optional<solo_answer>                 solo;    // or solo, on its request's thread, while nothing else runs
    std::vector<float>                         logits;  // there: the distribution of the next token
};

class scheduler {
  public:
    // cores: told how many requests run (null: each runs with the session's threads). engine: where prefills run.
    scheduler(const llama::session & s, cache_tier & cache, serve_stats & stats, int32_t slots, int32_t queue,
              core_share * cores = nullptr, engine_runner engine = {});

    // A place among the slots, freed when the last copy is gone (the answer streamed out). Waits for one; throws
    // request_error 503 when every slot and the queue are taken.
    struct place;
    std::shared_ptr<place> admit();

    // What a slot runs: its request's prompt and what it resumed (idle: is_processing false, the last request's).
    struct slot_state {
        bool                      is_processing = false;
        int32_t                   prompt_cells = 0, cached_cells = 0;
        std::optional<entry_kind> hit;
    };
    struct load {
        int32_t                 slots = 0, busy = 0, waiting = 0;
        std::vector<slot_state> each;
    };
    load load_now() const;
    // Runs f where the engine's work runs (core-share.h).
    void on_engine(const std::function<void()> & f) const;

    // The request's prompt on its cache: the longest kept entry it starts with (a conversation it continues, or a
    // context it asks about) resumed and only the rest decoded; or the prompt prefilled with `c`, what comes before
    // the last user message's text (the context) first, compressed as ecokv run --question does and kept as a prefix
    // entry of its own, then the question. Kept as it stands. Throws request_error for a prompt the engine cannot take.
    std::shared_ptr<turn> begin(const place & at, const chat_request & r, const compression & c);
    // The turn ended with `decoded` tokens decoded after its prompt: the sequence ends its turn (compressed again
    // over budget + recompress_slack) and the conversation is kept for the next turn, replacing the one kept after
    // the prompt. Returns the conversation as it stands (not kept when ending the turn failed; the answer still goes out).
    // A turn of the decode loop leaves its seat here, its state the conversation kept.
    std::shared_ptr<const cached_conversation> finish(turn & t, const std::vector<llama_token> & decoded);

  private:
    void prefill(turn & t, const llama::prompt & p, const chat_request & r, const compression & c,
                 const std::function<size_t()> & context_end);

    const llama::session &  s_;
    cache_tier &            cache_;
    serve_stats &           stats_;
    const int32_t           slots_, queue_;
    core_share *            cores_;
    engine_runner           engine_;
    mutable std::mutex      mutex_;
    std::condition_variable free_;
    int32_t                 busy_ = 0, waiting_ = 0;
    std::vector<slot_state> slot_states_;
};

}  // namespace ecokv::serve
