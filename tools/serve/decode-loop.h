// ecokv serve: the one decode loop (continuous batching over ragged caches, issue 50). Every answer being generated
// is a seat of one llama::batch: one llama.cpp context whose KV memory (-c cells, plus kept rows per head for the
// compressed prompts) all live sequences share. A request thread enters its prompt's cache as a snapshot (admitted
// while it fits, else it waits, among at most `queue` others), then hands over each token it picked; the loop thread
// decodes the next token of every seat that handed one over in one llama_decode, and each thread gets its logits back.
// The rest of the engine's work (prefills, ...: on_engine) runs on the loop's lanes: the loop's thread, which also
// steps, and lanes - 1 more. Pieces running beside others get cores / lanes threads each, never two teams of several
// threads on the same cores (ggml's OpenMP teams spin against each other). On 2 cores two one-thread prefills (or a
// prefill beside the steps) do more than one on both.
// A request alone (nothing live, running or queued) runs as without the loop: its prefill and its answer's tokens on
// its own thread, on every core (solo), until another request comes; then it enters the loop. Handing a lone
// request's work to a lane costs 15-25% on a 2-core VM (docs/serve.md: woken threads time-sliced on one core).
#pragma once

#include "chat-request.h"
#include "core-share.h"

#include "ecokv/llama-batch.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace ecokv::serve {

class decode_loop {
  public:
    // lanes: pieces of engine work at once (1: one at a time, on every core); cores: the threads of a piece alone.
    decode_loop(const llama::session & s, const llama::batch_options & o, int32_t queue, int32_t lanes, int32_t cores);
    ~decode_loop();
    decode_loop(const decode_loop &) = delete;
    decode_loop & operator=(const decode_loop &) = delete;

    // Whether `snap` with room for n_new tokens fits the loop's memory when nothing else is in it.
    bool               could_fit(const llama::snapshot & snap, int32_t n_new) const;
    // Admits `snap` with room for n_new tokens once it fits; returns its seat. Throws request_error: 400 when it can
    // never fit the pool, 503 when `queue` requests wait already.
    int32_t            enter(const llama::snapshot & snap, int32_t n_new);
    // Decodes `tok` at the seat in the next step and returns the seat's logits after it. Throws ecokv::error.
    std::vector<float> next(int32_t seat, llama_token tok);
    llama::snapshot    leave(int32_t seat);  // the seat's state, and the seat freed
    void               drop(int32_t seat);
    // Runs f (the engine_runner of the scheduler) and returns when it is done, rethrowing what it threw: on this
    // thread with every core when the loop is idle (nothing live, running, queued or solo), else on a lane between
    // two steps. Steps and such work alternate while both wait.
    void               on_engine(const std::function<void()> & f);
    // A solo answer: claimed while the loop is idle (false otherwise); its tokens then decode on its own thread with
    // every core (decode_solo) while nothing else is live, running or queued, and it enters the loop (end_solo, then
    // enter) the first time decode_solo says false.
    bool               begin_solo();
    bool               decode_solo(const std::function<void()> & f);
    void               end_solo();
    uint64_t           kv_bytes_of_cells(int32_t n) const { return batch_.kv_bytes_of_cells(n); }

    struct load {
        int32_t  live = 0, waiting = 0, cells_promised = 0, n_cells = 0, kept_rows_used = 0, kept_rows = 0;
        uint64_t steps = 0, tokens = 0;  // llama_decode calls and the tokens they decoded
    };
    load load_now() const;

    // The threads of the engine work running on this thread now: its lane's share, or 0 outside a lane (the
    // session's threads_now asks it).
    static int32_t lane_threads();

  private:
    struct pending {
        llama_token        token = 0;
        bool               asked = false, done = false;
        bool               live = false, recent = false;  // entered and not left; in the last step
        std::string        error;
        std::vector<float> logits;
    };
    bool idle(int32_t solo_mine) const;  // under the mutex: nothing live, running or queued; solo_mine solo answers
    bool run_here(const std::function<void()> & f, int32_t solo_mine);
    std::exception_ptr run_piece(std::unique_lock<std::mutex> & lock, const std::function<void()> & f, bool others_wait);
    void run(int32_t lane);
    void step();
    void begin_piece(bool others_wait);  // under the mutex: this lane's threads
    void end_piece();

    llama::batch             batch_;
    const int32_t            queue_, kept_rows_, n_lanes_, cores_;
    struct task {
        const std::function<void()> * f = nullptr;
        bool                          done = false;
        std::exception_ptr            error;
    };
    std::deque<task *>       tasks_;
    mutable std::mutex       mutex_;
    // asked_: the lanes (a token handed over, a task, a piece ended, a seat entering or leaving); stepped_: the
    // request threads (their step or task done); freed_: those waiting for memory
    std::condition_variable  asked_, stepped_, freed_;
    std::vector<pending>     seats_;  // by seat
    int32_t                  waiting_ = 0;
    int32_t                  busy_lanes_ = 0;   // lanes (or threads running a piece alone) computing now
    int32_t                  solo_       = 0;   // solo answers: live to the lanes' choices, outside the batch
    bool                     exclusive_  = false;  // one of them on every core: the others start nothing
    bool                     stepper_in_task_ = false;  // lane 0 runs a task: another lane steps
    uint64_t                 steps_ = 0, tokens_ = 0;
    bool                     stop_ = false;
    std::vector<std::thread> lanes_;  // lane 0 steps and runs tasks; the others run tasks (and step while lane 0 runs one)
};

// A turn's seat in the decode loop: left with its state, or dropped when the turn ends otherwise (a client gone
// before its answer started, an error), so that no seat outlives its request.
class pool_seat {
  public:
    pool_seat(decode_loop & loop, int32_t seat) : loop_(&loop), seat_(seat) {}
    pool_seat(pool_seat && o) noexcept : loop_(std::exchange(o.loop_, nullptr)), seat_(o.seat_) {}
    pool_seat & operator=(pool_seat &&) = delete;
    ~pool_seat() {
        try {
            if (loop_) {
                loop_->drop(seat_);
            }
        } catch (...) {  // the seat is gone already
        }
    }
    std::vector<float> next(llama_token tok) { return loop_->next(seat_, tok); }
    llama::snapshot    leave() { return std::exchange(loop_, nullptr)->leave(seat_); }
    uint64_t           kv_bytes_of_cells(int32_t n) const { return loop_->kv_bytes_of_cells(n); }

  private:
    decode_loop * loop_;
    int32_t       seat_;
};

// A turn's solo answer (decode_loop::begin_solo), ended when it enters the loop or its turn ends.
class solo_answer {
  public:
    explicit solo_answer(decode_loop & loop) : loop_(&loop) {}
    solo_answer(solo_answer && o) noexcept : loop_(std::exchange(o.loop_, nullptr)) {}
    solo_answer & operator=(solo_answer &&) = delete;
    ~solo_answer() {
        if (loop_) {
            loop_->end_solo();
        }
    }
    bool decode(const std::function<void()> & f) { return loop_->decode_solo(f); }

  private:
    decode_loop * loop_;
};

}  // namespace ecokv::serve
