#include "conversation-cache.h"

#include <algorithm>

namespace ecokv::serve {

std::shared_ptr<const cached_conversation> conversation_cache::find(const std::vector<uint64_t> & units) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto                              best = lru_.end();
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
        const auto & key = (*it)->units;
        if (key.size() <= units.size() && std::equal(key.begin(), key.end(), units.begin()) &&
            (best == lru_.end() || key.size() > (*best)->units.size())) {
            best = it;
        }
    }
    if (best == lru_.end()) {
        return nullptr;
    }
    lru_.splice(lru_.begin(), lru_, best);
    return lru_.front();
}

void conversation_cache::put(std::shared_ptr<const cached_conversation> c, const cached_conversation * replaces) {
    const std::lock_guard<std::mutex> lock(mutex_);
    // the conversation it continues, and one kept with the same units by a request that ran alongside
    for (auto it = lru_.begin(); it != lru_.end();) {
        const auto next = std::next(it);
        if (it->get() == replaces || (*it)->units == c->units) {
            drop(it);
        }
        it = next;
    }
    if (c->snap.bytes() > max_bytes_) {
        return;
    }
    t_.bytes += c->snap.bytes();
    t_.full_bytes += c->full_bytes;
    lru_.push_front(std::move(c));
    while (t_.bytes > max_bytes_) {
        drop(std::prev(lru_.end()));
        ++t_.evictions;
    }
}

void conversation_cache::drop(std::list<std::shared_ptr<const cached_conversation>>::iterator it) {
    t_.bytes -= (*it)->snap.bytes();
    t_.full_bytes -= (*it)->full_bytes;
    lru_.erase(it);
}

conversation_cache::totals conversation_cache::totals_now() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    totals t   = t_;
    t.prefixes = size_t(std::count_if(lru_.begin(), lru_.end(), [](const auto & c) { return c->kind == entry_kind::prefix; }));
    t.conversations = lru_.size() - t.prefixes;
    return t;
}

}  // namespace ecokv::serve
