#include "redis-store.h"

#include "ecokv/error.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <regex>

namespace ecokv::serve {

namespace el = ecokv::llama;

namespace {

using clock_type = std::chrono::steady_clock;

constexpr size_t k_queue_max = 64;

struct reply_deleter {
    void operator()(redisReply * r) const { freeReplyObject(r); }
};
using reply = std::unique_ptr<redisReply, reply_deleter>;

}  // namespace

const char * entry_fault_name(el::entry_fault f) {
    switch (f) {
        case el::entry_fault::truncated: return "truncated";
        case el::entry_fault::corrupted: return "corrupted";
        case el::entry_fault::version: return "stale";
        case el::entry_fault::foreign_model: return "foreign";
        case el::entry_fault::other_shape: return "other_shape";
        case el::entry_fault::malformed: return "malformed";
    }
    return "?";
}

namespace {

std::string hex(const uint8_t * p, size_t n) {
    static const char digits[] = "0123456789abcdef";
    std::string       s;
    for (size_t i = 0; i < n; ++i) {
        s += digits[p[i] >> 4];
        s += digits[p[i] & 15];
    }
    return s;
}

// The XXH3-128 digests of units[0, n) for each n of `lengths` (ascending), in one pass.
std::vector<std::array<uint8_t, 16>> prefix_digests(const std::vector<uint64_t> & units, const std::vector<size_t> & lengths) {
    XXH3_state_t * st = XXH3_createState();
    XXH3_128bits_reset(st);
    std::vector<std::array<uint8_t, 16>> out;
    size_t                               done = 0;
    for (const size_t n : lengths) {
        XXH3_128bits_update(st, units.data() + done, (n - done) * sizeof(uint64_t));
        done = n;
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
        out.emplace_back();
        std::copy(std::begin(c.digest), std::end(c.digest), out.back().begin());
    }
    XXH3_freeState(st);
    return out;
}

}  // namespace

store_options store_options::from_url(const std::string & url) {
    static const std::regex form(R"(redis://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:]+\])(:([0-9]{1,5}))?(/([0-9]{1,2}))?/?)");
    std::smatch             m;
    if (!std::regex_match(url, m, form)) {
        throw error("--store: '" + url + "' is not redis://HOST[:PORT][/DB]");
    }
    store_options o;
    o.host = m[1].str();
    if (o.host.front() == '[') {
        o.host = o.host.substr(1, o.host.size() - 2);
    }
    o.port = m[3].matched ? std::stoi(m[3].str()) : 6379;
    o.db   = m[5].matched ? std::stoi(m[5].str()) : 0;
    if (o.port < 1 || o.port > 65535) {
        throw error("--store: '" + url + "': port " + m[3].str() + " is not in [1, 65535] (redis://HOST[:PORT][/DB])");
    }
    return o;
}

// A connection that is made on first use and again after any failure, at most one attempt a second.
class redis_store::link {
  public:
    explicit link(redis_store & owner) : owner_(owner) {}
    ~link() { drop(); }

    // Connected (and authenticated, on its database), or nullptr while Redis is unreachable.
    redisContext * get() {
        if (ctx_ != nullptr) {
            return ctx_;
        }
        const auto now = clock_type::now();
        if (tried_ && now - last_try_ < std::chrono::seconds(1)) {
            return nullptr;
        }
        tried_    = true;
        last_try_ = now;
        const store_options & o = owner_.o_;
        ctx_                    = redisConnectWithTimeout(o.host.c_str(), o.port, { 0, 250000 });
        std::string why         = ctx_ == nullptr ? "out of memory" : ctx_->err ? ctx_->errstr : "";
        if (why.empty()) {
            redisSetTimeout(ctx_, { 2, 0 });
            why = command_error(o.password.empty() ? nullptr : "AUTH", o.password);
            if (why.empty() && o.db != 0) {
                why = command_error("SELECT", std::to_string(o.db));
            }
            if (why.empty()) {  // a Redis that wants a password answers NOAUTH here, not at connecting
                why = command_error("PING", "");
            }
        }
        owner_.connected(why.empty(), why);
        if (!why.empty()) {
            drop();
        }
        return ctx_;
    }
    // After an I/O error the context is unusable: freed, and made again at the next get() (a Redis restarted since
    // the connection was made answers at once; one that is down starts the once-a-second tries).
    void broken(const std::string & why) {
        drop();
        tried_ = false;
        owner_.connected(false, why);
    }
    std::string error_text() const { return ctx_ && ctx_->err ? ctx_->errstr : "no reply"; }

  private:
    std::string command_error(const char * cmd, const std::string & arg) {
        if (cmd == nullptr) {
            return "";
        }
        reply r(static_cast<redisReply *>(arg.empty() ? redisCommand(ctx_, cmd)
                                                      : redisCommand(ctx_, "%s %b", cmd, arg.data(), arg.size())));
        return !r                            ? error_text()
               : r->type == REDIS_REPLY_ERROR ? std::string(cmd) + ": " + std::string(r->str, r->len)
                                              : "";
    }
    void drop() {
        if (ctx_ != nullptr) {
            redisFree(ctx_);
            ctx_ = nullptr;
        }
    }

    redis_store &          owner_;
    redisContext *         ctx_   = nullptr;
    bool                   tried_ = false;
    clock_type::time_point last_try_;
};

redis_store::redis_store(store_options o, el::entry_header expected) :
    o_(std::move(o)),
    expected_(std::move(expected)),
    ns_([&] {
        const uint64_t fp = expected_.model_fingerprint;
        return o_.prefix + hex(reinterpret_cast<const uint8_t *>(&fp), sizeof fp) + ":";
    }()),
    reader_(std::make_unique<link>(*this)),
    writer_(std::make_unique<link>(*this)) {
    {
        const std::lock_guard<std::mutex> lock(read_mutex_);
        reader_->get();  // now, so that an unreachable Redis is reported at start
    }
    writer_thread_ = std::thread([this] { write_loop(); });
}

redis_store::~redis_store() {
    {
        const std::lock_guard<std::mutex> lock(queue_mutex_);
        stopping_ = true;
    }
    queued_.notify_all();
    writer_thread_.join();
}

void redis_store::connected(bool ok, const std::string & why) {
    const std::lock_guard<std::mutex> lock(state_mutex_);
    if (ok && !t_.up) {
        if (ever_up_ || warned_down_) {
            ++t_.reconnects;
            std::fprintf(stderr, "ecokv serve: store redis://%s:%d connected again\n", o_.host.c_str(), o_.port);
        }
        warned_down_ = false;
        ever_up_     = true;
    } else if (!ok && (t_.up || !warned_down_)) {
        std::fprintf(stderr,
                     "ecokv serve: warning: store redis://%s:%d unreachable (%s): serving from this replica's own "
                     "cache, trying again every second\n",
                     o_.host.c_str(), o_.port, why.c_str());
        warned_down_ = true;
    }
    t_.up = ok;
}

std::string redis_store::entry_key(const std::array<uint8_t, 16> & digest) const {
    return ns_ + "e:" + hex(digest.data(), digest.size());
}

std::string redis_store::lengths_key(uint64_t first_unit) const {
    return ns_ + "n:" + hex(reinterpret_cast<const uint8_t *>(&first_unit), sizeof first_unit);
}

std::shared_ptr<const cached_conversation> redis_store::find(const std::vector<uint64_t> & units, size_t longer_than) {
    if (units.empty() || longer_than >= units.size()) {
        return nullptr;
    }
    const std::lock_guard<std::mutex> lock(read_mutex_);
    std::shared_ptr<const cached_conversation> found;
    bool                                       answered = false;
    // twice: a connection that Redis closed (a restart) fails once, then is made again
    for (int attempt = 0; attempt < 2 && !answered && reader_->get() != nullptr; ++attempt) {
        answered = read(*reader_, units, longer_than, found);
    }
    const std::lock_guard<std::mutex> state(state_mutex_);
    ++(found ? t_.hits : t_.misses);
    return found;
}

bool redis_store::read(link & l, const std::vector<uint64_t> & units, size_t longer_than,
                       std::shared_ptr<const cached_conversation> & found) {
    redisContext * c = l.get();
    const auto     lengths_of = lengths_key(units[0]);
    const std::string above = "(" + std::to_string(longer_than), most = std::to_string(units.size());
    reply r(static_cast<redisReply *>(redisCommand(c, "ZRANGEBYSCORE %b %s %s", lengths_of.data(), lengths_of.size(),
                                                   above.c_str(), most.c_str())));
    if (!r || r->type != REDIS_REPLY_ARRAY) {
        l.broken(!r ? l.error_text() : r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "unexpected reply");
        return false;
    }
    std::vector<size_t> lengths;
    for (size_t i = 0; i < r->elements; ++i) {
        const redisReply * e = r->element[i];
        const size_t       n = e->type == REDIS_REPLY_STRING ? std::strtoull(e->str, nullptr, 10) : 0;
        if (n > longer_than && n <= units.size()) {
            lengths.push_back(n);
        }
    }
    std::sort(lengths.begin(), lengths.end());
    lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
    if (lengths.empty()) {
        return true;
    }
    std::vector<std::string> keys;
    for (const auto & d : prefix_digests(units, lengths)) {
        keys.push_back(entry_key(d));
        redisAppendCommand(c, "EXISTS %b", keys.back().data(), keys.back().size());
    }
    std::vector<bool> exists(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
        void * p = nullptr;
        if (redisGetReply(c, &p) != REDIS_OK) {
            l.broken(l.error_text());
            return false;
        }
        const reply e(static_cast<redisReply *>(p));
        exists[i] = e->type == REDIS_REPLY_INTEGER && e->integer == 1;
    }
    for (size_t i = keys.size(); i-- > 0;) {  // the longest first; one expired meanwhile is passed over
        if (!exists[i]) {
            continue;
        }
        reply g(static_cast<redisReply *>(redisCommand(c, "GET %b", keys[i].data(), keys[i].size())));
        if (!g) {
            l.broken(l.error_text());
            return false;
        }
        if (g->type != REDIS_REPLY_STRING) {
            continue;
        }
        try {
            el::entry e = el::decode_entry_for({ reinterpret_cast<const uint8_t *>(g->str), g->len }, expected_);
            if (e.units.size() != lengths[i] || !std::equal(e.units.begin(), e.units.end(), units.begin())) {
                throw el::entry_error(el::entry_fault::malformed, "the entry holds other prompt units than its key names");
            }
            if (compression_unit(e.header.compression_key) != units[0]) {
                throw el::entry_error(el::entry_fault::malformed, "the entry was made with another compression ('" +
                                                                      e.header.compression_key + "') than its key names");
            }
            auto kept        = std::make_shared<cached_conversation>();
            kept->units      = std::move(e.units);
            kept->snap       = std::move(e.snap);
            kept->full_bytes = e.kv_bytes_full;
            kept->kind       = e.role == el::entry_role::context ? entry_kind::prefix : entry_kind::conversation;
            kept->compression_key = std::move(e.header.compression_key);
            found                 = std::move(kept);
        } catch (const el::entry_error & e) {  // treated as a miss: the request is prefilled
            refuse(e);
        }
        return true;
    }
    return true;
}

void redis_store::refuse(const el::entry_error & e) {
    const std::lock_guard<std::mutex> lock(state_mutex_);
    const auto                        f = size_t(e.fault);
    ++t_.refused[f];
    if (!logged_fault_[f]) {  // once a kind: a bad entry is asked for again by every request that continues it
        logged_fault_[f] = true;
        std::fprintf(stderr, "ecokv serve: warning: refused a %s entry from the store (%s); treated as a miss "
                             "(counted in ecokv_store_entries_refused_total)\n", entry_fault_name(e.fault), e.what());
    }
}

void redis_store::put(std::shared_ptr<const cached_conversation> c) {
    {
        const std::lock_guard<std::mutex> lock(queue_mutex_);
        if (queue_.size() >= k_queue_max) {
            queue_.pop_front();
            const std::lock_guard<std::mutex> state(state_mutex_);
            ++t_.dropped;
        }
        queue_.push_back(std::move(c));
    }
    queued_.notify_one();
}

void redis_store::flush() {
    std::unique_lock<std::mutex> lock(queue_mutex_);
    drained_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

void redis_store::write_loop() {
    for (;;) {
        std::shared_ptr<const cached_conversation> c;
        {
            std::unique_lock<std::mutex> lock(queue_mutex_);
            queued_.wait_for(lock, std::chrono::seconds(1), [&] { return stopping_ || !queue_.empty(); });
            if (queue_.empty() && stopping_) {
                return;
            }
            if (queue_.empty()) {  // idle: while Redis is down, try it every second, so that /metrics and /health
                lock.unlock();     // say when it is back without waiting for a request
                if (!totals_now().up) {
                    writer_->get();
                }
                continue;
            }
            c = std::move(queue_.front());
            queue_.pop_front();
            writing_ = true;
        }
        bool written = false;  // twice, as a lookup: a connection that Redis closed fails once
        for (int attempt = 0; attempt < 2 && !written && writer_->get() != nullptr; ++attempt) {
            written = write(*writer_, *c);
        }
        if (!written) {
            const std::lock_guard<std::mutex> state(state_mutex_);
            ++t_.dropped;
        }
        {
            const std::lock_guard<std::mutex> lock(queue_mutex_);
            writing_ = false;
        }
        drained_.notify_all();
    }
}

// One SET of the whole entry (atomic: replicas writing the same key at once leave one of their entries, never a mix),
// then its length added to the compression's index, whose expiry follows the newest entry's.
bool redis_store::write(link & l, const cached_conversation & c) {
    el::entry e;
    e.header                 = expected_;
    e.header.compression_key = c.compression_key;
    e.units                  = c.units;
    e.snap                   = c.snap;
    e.role                   = c.kind == entry_kind::prefix ? el::entry_role::context : el::entry_role::conversation;
    e.kv_bytes_full          = c.full_bytes;
    const std::vector<uint8_t> bytes = el::encode_entry(e);
    const std::string key = entry_key(prefix_digests(c.units, { c.units.size() }).front()), lengths_of = lengths_key(c.units.front());
    const std::string n   = std::to_string(c.units.size()), ttl = std::to_string(o_.ttl_s);
    redisContext *    ctx = l.get();
    redisAppendCommand(ctx, "SET %b %b EX %s", key.data(), key.size(), bytes.data(), bytes.size(), ttl.c_str());
    redisAppendCommand(ctx, "ZADD %b %s %s", lengths_of.data(), lengths_of.size(), n.c_str(), n.c_str());
    redisAppendCommand(ctx, "EXPIRE %b %s", lengths_of.data(), lengths_of.size(), ttl.c_str());
    bool ok = true;
    for (int i = 0; i < 3; ++i) {
        void * p = nullptr;
        if (redisGetReply(ctx, &p) != REDIS_OK) {
            l.broken(l.error_text());
            return false;
        }
        const reply r(static_cast<redisReply *>(p));
        ok = ok && r->type != REDIS_REPLY_ERROR;  // e.g. OOM under maxmemory with noeviction
    }
    const std::lock_guard<std::mutex> state(state_mutex_);
    ++(ok ? t_.writes : t_.write_errors);
    return true;
}

redis_store::totals redis_store::totals_now() const {
    const std::lock_guard<std::mutex> queue(queue_mutex_);
    const std::lock_guard<std::mutex> lock(state_mutex_);
    totals t = t_;
    t.queued = queue_.size() + (writing_ ? 1 : 0);
    return t;
}

std::shared_ptr<const cached_conversation> tiered_cache::find(const std::vector<uint64_t> & units) {
    auto hit = local_.find(units);
    if (shared_ == nullptr || (hit && hit->units.size() == units.size())) {
        return hit;
    }
    if (auto longer = shared_->find(units, hit ? hit->units.size() : 0)) {
        local_.put(longer);
        return longer;
    }
    return hit;
}

void tiered_cache::put(std::shared_ptr<const cached_conversation> c, const cached_conversation * replaces) {
    if (shared_ != nullptr && c->shared) {
        shared_->put(c);
    }
    local_.put(std::move(c), replaces);
}

}  // namespace ecokv::serve
