#include "decode-loop.h"

#include "ecokv/error.h"

#include <chrono>

namespace ecokv::serve {

namespace el = ecokv::llama;

namespace {

// How long a step waits, after the first token was handed over, for the other live seats' tokens: a request thread
// picks, detokenizes and streams a token in well under that, so a step holds every seat's without idling the cores.
constexpr auto k_gather = std::chrono::microseconds(1500);

}  // namespace

decode_loop::decode_loop(const el::session & s, const el::batch_options & o, int32_t queue) :
    batch_(s, o), queue_(queue), kept_rows_(o.n_kept_rows), seats_(size_t(o.n_seq_max)) {
    thread_ = std::thread([this] { run(); });
}

decode_loop::~decode_loop() {
    {
        const std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    asked_.notify_all();
    thread_.join();
}

bool decode_loop::could_fit(const el::snapshot & snap, int32_t n_new) const {
    const int32_t widest = snap.layout.empty() ? 0 : int32_t(*std::max_element(snap.layout.begin(), snap.layout.end()));
    return int64_t(snap.n_cells) + n_new <= batch_.n_cells() && widest <= kept_rows_;
}

int32_t decode_loop::enter(const el::snapshot & snap, int32_t n_new) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!could_fit(snap, n_new)) {
        const int32_t widest = snap.layout.empty() ? 0 : int32_t(*std::max_element(snap.layout.begin(), snap.layout.end()));
        throw request_error(400, "invalid_request_error", "max_tokens",
                            "the request needs " + std::to_string(snap.n_cells + n_new) + " KV cells and " +
                                std::to_string(widest) + " kept rows a head; the server holds " +
                                std::to_string(batch_.n_cells()) + " and " + std::to_string(kept_rows_) + " (-c, --kv-kept-rows)");
    }
    if (!batch_.fits(snap, n_new)) {
        if (waiting_ >= queue_) {
            throw request_error(503, "server_busy", "", "the KV memory and the queue are full; retry later");
        }
        ++waiting_;
        freed_.wait(lock, [&] { return batch_.fits(snap, n_new); });
        --waiting_;
    }
    const int32_t seat = batch_.admit(snap, n_new);
    seats_[size_t(seat)] = pending{};
    return seat;
}

std::vector<float> decode_loop::next(int32_t seat, llama_token tok) {
    std::unique_lock<std::mutex> lock(mutex_);
    pending & p = seats_.at(size_t(seat));
    p.token = tok;
    p.asked = true;
    p.done  = false;
    asked_.notify_all();
    stepped_.wait(lock, [&] { return p.done; });
    if (!p.error.empty()) {
        throw error(p.error);
    }
    return std::move(p.logits);
}

el::snapshot decode_loop::leave(int32_t seat) {
    std::unique_lock<std::mutex> lock(mutex_);
    el::snapshot s = batch_.release(seat);
    lock.unlock();
    freed_.notify_all();
    return s;
}

void decode_loop::drop(int32_t seat) {
    std::unique_lock<std::mutex> lock(mutex_);
    batch_.drop(seat);
    lock.unlock();
    freed_.notify_all();
}

void decode_loop::on_engine(const std::function<void()> & f) {
    task t{ &f, false, nullptr };
    std::unique_lock<std::mutex> lock(mutex_);
    tasks_.push_back(&t);
    asked_.notify_all();
    stepped_.wait(lock, [&] { return t.done; });
    if (t.error) {
        std::rethrow_exception(t.error);
    }
}

decode_loop::load decode_loop::load_now() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return { batch_.n_live(), waiting_, batch_.cells_promised(), batch_.n_cells(), batch_.kept_rows_used(), kept_rows_,
             steps_, tokens_ };
}

// Waits for a token or a task. A step: up to k_gather for every live seat's token (not when a task waits), then every
// token handed over by then decoded in one llama_decode, with the mutex held (the seats in it are waiting for it, and
// entering or leaving changes the batch). A task runs with the mutex released. Each round does at most one of each.
void decode_loop::run() {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto n_asked = [&] {
        return int32_t(std::count_if(seats_.begin(), seats_.end(), [](const pending & p) { return p.asked; }));
    };
    while (true) {
        asked_.wait(lock, [&] { return stop_ || n_asked() > 0 || !tasks_.empty(); });
        if (stop_) {
            return;
        }
        if (n_asked() > 0) {
            asked_.wait_for(lock, k_gather, [&] { return stop_ || !tasks_.empty() || n_asked() >= batch_.n_live(); });
            step();
        }
        if (!tasks_.empty()) {
            task * t = tasks_.front();
            tasks_.pop_front();
            lock.unlock();
            try {
                (*t->f)();
            } catch (...) {
                t->error = std::current_exception();
            }
            lock.lock();
            t->done = true;
            stepped_.notify_all();
        }
    }
}

void decode_loop::step() {
    std::vector<std::pair<int32_t, std::vector<llama_token>>> work;
    for (size_t i = 0; i < seats_.size(); ++i) {
        if (seats_[i].asked) {
            work.push_back({ int32_t(i), { seats_[i].token } });
        }
    }
    std::string failed;
    try {
        batch_.step(work);
    } catch (const std::exception & e) {
        failed = e.what();
    }
    ++steps_;
    tokens_ += work.size();
    for (const auto & [i, tokens] : work) {
        pending & p = seats_[size_t(i)];
        p.asked     = false;
        p.done      = true;
        p.error     = failed;
        if (failed.empty()) {
            p.logits = batch_.logits(i);
        }
    }
    stepped_.notify_all();
}

}  // namespace ecokv::serve
