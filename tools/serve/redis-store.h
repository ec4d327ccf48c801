// ecokv serve: the second tier of kept entries, shared by every replica of a cluster: Redis (Debian's redis-server,
// through Debian's hiredis client). An entry is ecokv's checked format (ecokv/llama-entry.h), under
//   PREFIX<model fingerprint>:e:<XXH3-128 of its units>   the entry, expiring after --store-ttl (Redis's own expiry)
//   PREFIX<model fingerprint>:n:<its first unit>          a sorted set of the unit counts kept under one compression,
//                                                         so that a lookup asks only for prefix lengths that exist
// Writes go through a queue to a writer thread and never delay an answer; lookups ask Redis on the request's thread
// (three round trips on loopback: the lengths, which of them exist, the longest). Redis unreachable: lookups miss and
// writes are dropped at once, with one warning, and a reconnection is tried every second, with or without requests
// (counted); a connection that Redis closed (a restart) is made again at once.
#pragma once

#include "cache-tier.h"

#include "ecokv/llama-entry.h"

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

namespace ecokv::serve {

struct store_options {
    std::string host;
    int         port = 6379, db = 0;
    std::string password;            // Redis AUTH (--store-password-file); empty: none
    int32_t     ttl_s  = 3600;       // an entry's expiry, renewed by every write of it
    std::string prefix = "ecokv:";   // of every key, so that clusters can share one Redis

    // redis://HOST[:PORT][/DB]; throws ecokv::error naming what is wrong.
    static store_options from_url(const std::string & url);
};

// What /metrics and the log call an entry_fault: truncated, corrupted, stale, foreign, other_shape, malformed.
const char * entry_fault_name(llama::entry_fault f);

class redis_store {
  public:
    // expected: the model and cache shape an entry must have been made by (its compression key is not checked:
    // the first unit of the key names the compression).
    redis_store(store_options o, llama::entry_header expected);
    ~redis_store();  // the queued writes are written first

    // The longest stored entry with more than `longer_than` units whose units start `units`, checked whole; nullptr
    // when there is none, Redis is down, or the entry is refused (foreign, stale, truncated, corrupted: counted and
    // logged once a kind).
    std::shared_ptr<const cached_conversation> find(const std::vector<uint64_t> & units, size_t longer_than);
    // Queues c for the writer (the oldest queued write dropped past 64).
    void put(std::shared_ptr<const cached_conversation> c);
    // Returns once every write queued before it is written or dropped.
    void flush();

    struct totals {
        bool     up = false;
        uint64_t hits = 0, misses = 0, writes = 0, write_errors = 0, dropped = 0, reconnects = 0;
        size_t   queued = 0;  // writes waiting or under way
        std::array<uint64_t, 6> refused{};  // by llama::entry_fault
    };
    totals totals_now() const;

  private:
    class link;  // one connection to Redis, made again after a failure

    std::string entry_key(const std::array<uint8_t, 16> & digest) const;
    std::string lengths_key(uint64_t first_unit) const;
    // One lookup or write over l: false when the connection failed (l is then broken), true when Redis answered.
    bool read(link & l, const std::vector<uint64_t> & units, size_t longer_than,
              std::shared_ptr<const cached_conversation> & found);
    bool write(link & l, const cached_conversation & c);
    void refuse(const llama::entry_error & e);
    void write_loop();
    void connected(bool ok, const std::string & why);

    const store_options       o_;
    const llama::entry_header expected_;
    const std::string         ns_;  // prefix and fingerprint

    std::mutex            read_mutex_;  // the lookups' connection
    std::unique_ptr<link> reader_, writer_;

    mutable std::mutex                                     queue_mutex_;
    std::condition_variable                                queued_, drained_;
    std::deque<std::shared_ptr<const cached_conversation>> queue_;
    bool                                                   stopping_ = false, writing_ = false;

    mutable std::mutex state_mutex_;
    totals             t_;
    bool               warned_down_ = false, ever_up_ = false;
    std::array<bool, 6> logged_fault_{};
    std::thread        writer_thread_;
};

// The local tier first, then the shared store: a request finds the longest entry in either (one found in the store is
// kept locally too); every entry kept goes to both.
class tiered_cache final : public cache_tier {
  public:
    tiered_cache(cache_tier & local, redis_store * shared) : local_(local), shared_(shared) {}

    std::shared_ptr<const cached_conversation> find(const std::vector<uint64_t> & units) override;
    void   put(std::shared_ptr<const cached_conversation> c, const cached_conversation * replaces = nullptr) override;
    totals totals_now() const override { return local_.totals_now(); }

  private:
    cache_tier &  local_;
    redis_store * shared_;
};

}  // namespace ecokv::serve
