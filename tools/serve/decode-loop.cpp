#include "decode-loop.h"

#include "ecokv/error.h"

#include <chrono>

namespace ecokv::serve {

namespace el = ecokv::llama;

namespace {

// How long a step waits, after the first token was handed over, for those of the seats in the last step: a request
// thread picks, detokenizes and streams a token in well under that, so a step holds every seat's without idling the
// cores.
constexpr auto k_gather = std::chrono::microseconds(1500);

thread_local int32_t t_lane_threads = 0;

}  // namespace

decode_loop::decode_loop(const el::session & s, const el::batch_options & o, int32_t queue, int32_t lanes,
                         int32_t cores) :
    batch_(s, o),
    queue_(queue),
    kept_rows_(o.n_kept_rows),
    n_lanes_(std::max(1, lanes)),
    cores_(std::max(1, cores)),
    seats_(size_t(o.n_seq_max)) {
    for (int32_t i = 0; i < n_lanes_; ++i) {
        lanes_.emplace_back([this, i] { run(i); });
    }
}

decode_loop::~decode_loop() {
    {
        const std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    asked_.notify_all();
    for (std::thread & t : lanes_) {
        t.join();
    }
}

int32_t decode_loop::lane_threads() { return t_lane_threads; }

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
    seats_[size_t(seat)].live = true;
    asked_.notify_all();
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
    seats_[size_t(seat)].live = false;
    lock.unlock();
    freed_.notify_all();
    asked_.notify_all();  // which lane may take a task depends on the seats live
    return s;
}

void decode_loop::drop(int32_t seat) {
    std::unique_lock<std::mutex> lock(mutex_);
    batch_.drop(seat);
    seats_[size_t(seat)].live = false;
    lock.unlock();
    freed_.notify_all();
    asked_.notify_all();
}

void decode_loop::on_engine(const std::function<void()> & f) {
    if (run_here(f, 0)) {
        return;
    }
    task t{ &f, false, nullptr };
    std::unique_lock<std::mutex> lock(mutex_);
    tasks_.push_back(&t);
    asked_.notify_all();
    stepped_.wait(lock, [&] { return t.done; });
    if (t.error) {
        std::rethrow_exception(t.error);
    }
}

bool decode_loop::idle(int32_t solo_mine) const {
    return busy_lanes_ == 0 && tasks_.empty() && batch_.n_live() == 0 && solo_ == solo_mine;
}

// f on this thread, on every core, nothing else starting until it ends, if the loop is idle.
bool decode_loop::run_here(const std::function<void()> & f, int32_t solo_mine) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!idle(solo_mine)) {
        return false;
    }
    if (const std::exception_ptr failed = run_piece(lock, f, false)) {
        std::rethrow_exception(failed);
    }
    return true;
}

// f as a piece on this thread (its threads by begin_piece), the mutex released meanwhile; what it threw.
std::exception_ptr decode_loop::run_piece(std::unique_lock<std::mutex> & lock, const std::function<void()> & f,
                                          bool others_wait) {
    begin_piece(others_wait);
    lock.unlock();
    std::exception_ptr failed;
    try {
        f();
    } catch (...) {
        failed = std::current_exception();
    }
    lock.lock();
    end_piece();
    return failed;
}

bool decode_loop::begin_solo() {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (!idle(0)) {
        return false;
    }
    ++solo_;
    return true;
}

bool decode_loop::decode_solo(const std::function<void()> & f) { return run_here(f, 1); }

void decode_loop::end_solo() {
    {
        const std::lock_guard<std::mutex> lock(mutex_);
        --solo_;
    }
    asked_.notify_all();  // which lane may take a task depends on it
}

decode_loop::load decode_loop::load_now() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return { batch_.n_live(), waiting_, batch_.cells_promised(), batch_.n_cells(), batch_.kept_rows_used(), kept_rows_,
             steps_, tokens_ };
}

// Each lane waits for work it may start: lane 0 (or, while lane 0 runs a task, any other lane) a step when a token was
// handed over (up to k_gather for those of the seats in the last step), else a task when no answer is live (a seat
// or solo) or every other lane is busy (a task there holds the steps back, as a prompt in llama-server's batch does);
// the other lanes a task beside other work (a lone one queued while a piece ran is lane 0's: one warm OpenMP team for
// the lanes' pieces with all the cores).
// Nothing starts while a piece runs on every core. A step runs with the mutex held (the seats in it are waiting for
// it, and entering or leaving changes the batch), a task with it released. Whatever changes these conditions
// notifies asked_.
void decode_loop::run(int32_t lane) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto n_asked = [&] {
        return int32_t(std::count_if(seats_.begin(), seats_.end(), [](const pending & p) { return p.asked; }));
    };
    // the seats of the last step that are still live have all handed their next token over (a seat that just
    // entered, or is about to leave, is not waited for)
    const auto all_recent_asked = [&] {
        return std::none_of(seats_.begin(), seats_.end(),
                            [](const pending & p) { return p.live && p.recent && !p.asked; });
    };
    // lane 0 steps; while it runs a task, a free lane steps in its place (rather than idle beside it)
    const auto may_step = [&] { return (lane == 0 || stepper_in_task_) && !exclusive_ && n_asked() > 0; };
    const auto may_task = [&] {
        if (exclusive_ || tasks_.empty()) {
            return false;
        }
        if (lane > 0) {  // only beside other work: a lone one queued is lane 0's, whose OpenMP team stays warm
            return busy_lanes_ > 0 || tasks_.size() > 1 || batch_.n_live() + solo_ > 0;
        }
        return n_asked() == 0 && (batch_.n_live() + solo_ == 0 || busy_lanes_ >= n_lanes_ - 1);
    };
    while (true) {
        asked_.wait(lock, [&] { return stop_ || may_step() || may_task(); });
        if (stop_) {
            return;
        }
        if (may_step()) {
            asked_.wait_for(lock, k_gather, [&] {
                return stop_ || all_recent_asked() || (!tasks_.empty() && busy_lanes_ >= n_lanes_ - 1);
            });
            if (exclusive_ || n_asked() == 0) {  // another lane stepped (or took every core) while this one gathered
                continue;
            }
            begin_piece(!tasks_.empty());
            step();
            end_piece();
            continue;
        }
        task * t = tasks_.front();
        tasks_.pop_front();
        stepper_in_task_ = stepper_in_task_ || lane == 0;
        t->error = run_piece(lock, *t->f, !tasks_.empty() || batch_.n_live() + solo_ > 0);
        stepper_in_task_ = stepper_in_task_ && lane != 0;
        t->done  = true;
        stepped_.notify_all();
    }
}

// A piece alone, with nothing else waiting, computes on every core, and nothing else starts until it ends; beside
// others, on this lane's share.
void decode_loop::begin_piece(bool others_wait) {
    exclusive_     = busy_lanes_ == 0 && !others_wait;
    t_lane_threads = exclusive_ ? cores_ : std::max(1, cores_ / n_lanes_);
    ++busy_lanes_;
}

void decode_loop::end_piece() {
    --busy_lanes_;
    exclusive_     = false;
    t_lane_threads = 0;
    asked_.notify_all();
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
    for (pending & p : seats_) {
        p.recent = false;
    }
    for (const auto & [i, tokens] : work) {
        pending & p = seats_[size_t(i)];
        p.recent    = true;
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
