// ecokv serve: where kept conversations live, behind one interface: the in-process LRU (conversation-cache.h), and
// with --store the replicas' shared Redis behind it (redis-store.h).
#pragma once

#include "ecokv/llama-session.h"

#include <xxhash.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ecokv::serve {

// What an entry holds: the (compressed) context before a question, which any request about it reuses; or a
// conversation, its prompt and the answer's tokens, which its next turn continues.
enum class entry_kind { prefix, conversation };

// A kept entry: the prompt units its cache holds (the compression's key unit, prompt::units(), then generated
// tokens) and the snapshot.
struct cached_conversation {
    std::vector<uint64_t> units;
    llama::snapshot       snap;
    uint64_t              full_bytes = 0;  // what the same cells would take uncompressed
    entry_kind            kind       = entry_kind::conversation;
    std::string           compression_key;  // compression::key() of what made it (what units[0] names)
    // false for the prompt's conversation before its answer, replaced when the turn ends: not worth a shared store's
    // write (an identical request on the same replica still finds it)
    bool                  shared = true;
};

// The first unit of an entry's key: the compression that made it (compression::key()), a value no token id or image
// hash takes, the same in every replica (a stable hash, so that a shared store's keys agree).
inline uint64_t compression_unit(const std::string & compression_key) {
    return XXH3_64bits(compression_key.data(), compression_key.size()) | (uint64_t(1) << 62);
}

class cache_tier {
  public:
    virtual ~cache_tier() = default;

    // The kept entry with the longest units that are a prefix of `units`, or equal to them (nullptr when none); it
    // becomes the most recently used. An equal one leaves nothing to decode: its snapshot's logits are the next
    // token's distribution.
    virtual std::shared_ptr<const cached_conversation> find(const std::vector<uint64_t> & units) = 0;

    // Keeps c, replacing `replaces` (the conversation it continues) when given and any entry kept with the same
    // units (by a request that ran alongside), within the tier's limit.
    virtual void put(std::shared_ptr<const cached_conversation> c, const cached_conversation * replaces = nullptr) = 0;

    struct totals {
        size_t   conversations = 0, prefixes = 0;  // entries of each kind
        uint64_t bytes = 0, full_bytes = 0, evictions = 0;
    };
    virtual totals totals_now() const = 0;
};

}  // namespace ecokv::serve
