// ecokv serve: the in-process tier of kept conversations, snapshots of their (compressed) caches found again by their
// prompt units.
#pragma once

#include "cache-tier.h"

#include <list>
#include <mutex>

namespace ecokv::serve {

// Least-recently-used conversations within a byte limit (snapshot sizes): on put, the least recently used are
// evicted until the limit holds, and a conversation larger than the whole limit is not kept. Thread-safe.
class conversation_cache final : public cache_tier {
  public:
    explicit conversation_cache(uint64_t max_bytes) : max_bytes_(max_bytes) {}

    std::shared_ptr<const cached_conversation> find(const std::vector<uint64_t> & units) override;
    void   put(std::shared_ptr<const cached_conversation> c, const cached_conversation * replaces = nullptr) override;
    totals totals_now() const override;

  private:
    void drop(std::list<std::shared_ptr<const cached_conversation>>::iterator it);

    mutable std::mutex                                    mutex_;
    std::list<std::shared_ptr<const cached_conversation>> lru_;  // most recent first
    uint64_t                                              max_bytes_ = 0;
    totals                                                t_;
};

}  // namespace ecokv::serve
