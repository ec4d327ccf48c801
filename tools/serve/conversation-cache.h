// ecokv serve: conversations kept as snapshots of their (compressed) caches, found again by their prompt units.
#pragma once

#include "ecokv/llama-session.h"

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

namespace ecokv::serve {

// A kept conversation: the prompt units its cache holds (prompt::units(), then generated tokens) and the snapshot.
struct cached_conversation {
    std::vector<uint64_t> units;
    llama::snapshot       snap;
    uint64_t              full_bytes = 0;  // what the same cells would take uncompressed
};

// Least-recently-used conversations within a byte limit (snapshot sizes). Thread-safe.
class conversation_cache {
  public:
    explicit conversation_cache(uint64_t max_bytes) : max_bytes_(max_bytes) {}

    // The kept conversation with the longest units that are a strict prefix of `units` (nullptr when none); it
    // becomes the most recently used. Strict: at least one unit is left to decode, which gives the logits of the next
    // token (a snapshot holds none), so two identical requests never resume with nothing to decode.
    std::shared_ptr<const cached_conversation> find(const std::vector<uint64_t> & units);

    // Keeps c, replacing `replaces` (the conversation it continues) when given and any conversation kept with the
    // same units (by a request that ran alongside), then evicts the least recently used until the limit holds. A
    // conversation larger than the whole limit is not kept.
    void put(std::shared_ptr<const cached_conversation> c, const cached_conversation * replaces = nullptr);

    struct totals {
        size_t   conversations = 0;
        uint64_t bytes = 0, full_bytes = 0, evictions = 0;
    };
    totals totals_now() const;

  private:
    void drop(std::list<std::shared_ptr<const cached_conversation>>::iterator it);

    mutable std::mutex                                    mutex_;
    std::list<std::shared_ptr<const cached_conversation>> lru_;  // most recent first
    uint64_t                                              max_bytes_ = 0;
    totals                                                t_;
};

}  // namespace ecokv::serve
