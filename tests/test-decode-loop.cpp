// ecokv serve's decode loop (tools/serve/decode-loop.h): how its lanes share the cores. A piece of engine work alone
// computes on every core, on the thread that asked (as without the loop); pieces at once run beside each other on
// the lanes, each on cores / lanes threads; steps go on beside a running task; one lane runs one piece at a time; a
// solo answer decodes on its own thread until another piece comes. Threads are what the session's threads_now hook answers inside the piece (the loop's lane_threads),
// recorded by the hook each decode asks. The answers themselves: test-batch (steps) and test-serve.sh (the server).
#include "decode-loop.h"

#include "ecokv/llama-generate.h"
#include "ecokv/llama-session.h"
#include "llama/session-test-util.h"
#include "llama/tiny-model.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

namespace {

using namespace ecokv::test;
namespace el = ecokv::llama;
using ecokv::serve::decode_loop;
using ecokv::serve::pool_seat;

// A piece's thread and the threads it was given.
struct seen {
    std::thread::id thread;
    int32_t         threads = 0;
};

seen here() {
    return { std::this_thread::get_id(), decode_loop::lane_threads() };
}

// Blocks until `n` parties arrived or 10 s passed; false on the timeout (the parties never ran at once).
class meeting {
  public:
    explicit meeting(int32_t n) : left_(n) {}
    bool arrive() {
        std::unique_lock<std::mutex> lock(m_);
        if (--left_ == 0) {
            cv_.notify_all();
        }
        return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return left_ <= 0; });
    }

  private:
    std::mutex              m_;
    std::condition_variable cv_;
    int32_t                 left_;
};

struct fixture {
    std::mutex       steps_mutex;
    std::vector<int> step_threads;  // what threads_now answered on the loop's lanes
    tiny_model       m = make_tiny_model({});
    el::session      s;
    fixture() : s(*m.get(), opts()) {}
    el::session_options opts() {
        el::session_options o;
        o.n_threads   = 1;
        o.threads_now = [this] {
            const int32_t                     n = decode_loop::lane_threads();
            const std::lock_guard<std::mutex> lock(steps_mutex);
            step_threads.push_back(n);
            return std::max(1, n);
        };
        return o;
    }
};

// A piece asked from another thread that holds its lane until finish() (or 10 s); made once it runs.
struct held_piece {
    std::promise<void> release;
    std::atomic<bool>  started{ false };
    bool               released_in_time = false;
    seen               where;
    std::future<void>  done;
    explicit held_piece(decode_loop & loop) {
        done = std::async(std::launch::async, [this, &loop, r = release.get_future()] {
            loop.on_engine([&] {
                where            = here();
                started          = true;
                released_in_time = r.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
            });
        });
        while (!started) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }
    void finish() {
        release.set_value();
        done.get();
    }
};

// A full sequence's snapshot: 12 prompt tokens, room for 8 more.
el::snapshot a_snapshot(const fixture & f) {
    return f.s.prefill(f.s.make_prompt(prompt_tokens(12, f.m.config().n_vocab, 7)), ecokv::compression::none(), 8)
        .save();
}

TEST(decode_loop, a_piece_alone_has_every_core_on_its_thread_and_pieces_beside_a_seat_share_them) {
    fixture     f;
    decode_loop loop(f.s, { 64, 0, 2 }, 4, 2, 4);
    seen        a;
    loop.on_engine([&] { a = here(); });
    EXPECT_EQ(a.threads, 4);
    EXPECT_EQ(a.thread, std::this_thread::get_id()) << "a piece alone runs where it was asked";

    // with a live seat, two pieces at once: each waits for the other inside, which only works side by side
    const el::snapshot snap = a_snapshot(f);
    pool_seat          seat(loop, loop.enter(snap, 8));
    meeting            both(2);
    seen               x, y;
    bool               met_x = false, met_y = false;
    auto               other = std::async(std::launch::async, [&] {
        loop.on_engine([&] {
            y     = here();
            met_y = both.arrive();
        });
    });
    loop.on_engine([&] {
        x     = here();
        met_x = both.arrive();
    });
    other.get();
    EXPECT_TRUE(met_x && met_y) << "the two lanes did not run the two pieces at once";
    EXPECT_NE(x.thread, y.thread);
    EXPECT_EQ(x.threads, 2);
    EXPECT_EQ(y.threads, 2);
    EXPECT_EQ(decode_loop::lane_threads(), 0) << "outside the lanes";
}

TEST(decode_loop, one_lane_runs_one_piece_at_a_time_on_every_core) {
    fixture                        f;
    decode_loop                    loop(f.s, { 64, 0, 2 }, 4, 1, 2);
    std::atomic<int>               running{ 0 }, most{ 0 };
    std::vector<int>               threads(8, 0);
    std::vector<std::future<void>> all;
    for (int i = 0; i < 8; ++i) {
        all.push_back(std::async(std::launch::async, [&, i] {
            loop.on_engine([&, i] {
                most               = std::max(most.load(), ++running);
                threads[size_t(i)] = decode_loop::lane_threads();
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
                --running;
            });
        }));
    }
    for (auto & r : all) {
        r.get();
    }
    EXPECT_EQ(most.load(), 1);
    EXPECT_EQ(threads, std::vector<int>(8, 2));
}

// A sequence decodes in the loop while a task holds the other lane: its steps go on (here 3 of them, each asked by
// this thread, while the task waits for them), on one thread of the two.
TEST(decode_loop, steps_go_on_beside_a_task_on_their_share_of_the_cores) {
    fixture            f;
    decode_loop        loop(f.s, { 64, 0, 2 }, 4, 2, 2);
    const el::snapshot snap = a_snapshot(f);
    pool_seat          seat(loop, loop.enter(snap, 8));
    std::promise<void> stepped;
    seen               task;
    auto               side = std::async(std::launch::async, [&] {
        loop.on_engine([&] {
            task = here();
            stepped.get_future().wait_for(std::chrono::seconds(10));
        });
    });
    // the task is taken beside the live seat: wait until it runs
    for (int i = 0; i < 1000 && task.threads == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(task.threads, 1) << "a task beside a live seat runs on its lane's share";
    f.step_threads.clear();
    llama_token tok = el::argmax(snap.logits);
    for (int i = 0; i < 3; ++i) {
        tok = el::argmax(seat.next(tok));
    }
    stepped.set_value();
    side.get();
    {
        const std::lock_guard<std::mutex> lock(f.steps_mutex);
        EXPECT_EQ(f.step_threads, std::vector<int>(3, 1)) << "each step beside the task on one thread";
    }
}


// Lane 0 steps; while it runs a task (taken because the other lane was busy), the other lane, once free, steps in its
// place: here a task holds lane 0 until 3 steps are done, which only the other lane can then decode.
TEST(decode_loop, another_lane_steps_while_lane_0_runs_a_task) {
    fixture            f;
    decode_loop        loop(f.s, { 64, 0, 2 }, 4, 2, 2);
    const el::snapshot snap = a_snapshot(f);
    pool_seat          seat(loop, loop.enter(snap, 8));
    held_piece         first(loop);
    held_piece         second(loop);  // the other lane is busy: lane 0 takes it
    ASSERT_NE(first.where.thread, second.where.thread) << "the second task runs on the other lane (lane 0)";
    first.finish();
    f.step_threads.clear();
    llama_token tok = el::argmax(snap.logits);
    for (int i = 0; i < 3; ++i) {
        tok = el::argmax(seat.next(tok));
    }
    second.finish();
    EXPECT_TRUE(second.released_in_time) << "the steps waited for lane 0's task";
    const std::lock_guard<std::mutex> lock(f.steps_mutex);
    EXPECT_EQ(f.step_threads, std::vector<int>(3, 1)) << "each step beside the task on one thread";
}

// A solo answer decodes on its own thread with every core while nothing else runs. Another request's piece then runs
// on a lane beside it (on its share: the solo answer counts as live), and the solo answer's next decode is refused
// (its caller enters the loop); once it ends, a piece alone runs on its asker's thread again.
TEST(decode_loop, a_solo_answer_decodes_on_its_thread_until_another_piece_comes) {
    fixture     f;
    decode_loop loop(f.s, { 64, 0, 2 }, 4, 2, 4);
    ASSERT_TRUE(loop.begin_solo());
    EXPECT_FALSE(loop.begin_solo()) << "a second answer is not alone";
    seen solo;
    ASSERT_TRUE(loop.decode_solo([&] { solo = here(); }));
    EXPECT_EQ(solo.thread, std::this_thread::get_id());
    EXPECT_EQ(solo.threads, 4);

    held_piece other(loop);
    EXPECT_FALSE(loop.decode_solo([] {})) << "a piece runs: the solo answer must enter the loop";
    other.finish();
    EXPECT_NE(other.where.thread, std::this_thread::get_id());
    EXPECT_EQ(other.where.threads, 2) << "beside the solo answer: its lane's share";
    loop.end_solo();

    seen after;
    loop.on_engine([&] { after = here(); });
    EXPECT_EQ(after.thread, std::this_thread::get_id());
    EXPECT_EQ(after.threads, 4);
}

}  // namespace
