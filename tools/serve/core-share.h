// ecokv serve: how the cores are shared among the work running now.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>

namespace ecokv::serve {

// The cores the requests running now share (ecokv serve -t 0 --no-batch): each decode asks threads(), cores / users,
// so that a lone request computes on every core and n requests split them instead of each keeping cores / slots.
class core_share {
  public:
    explicit core_share(int32_t cores) : cores_(std::max(1, cores)) {}
    int32_t threads() const { return std::max(1, cores_ / std::max(1, users_.load())); }
    void    add_user(int32_t n) { users_ += n; }

  private:
    const int32_t        cores_;
    std::atomic<int32_t> users_{ 0 };
};

// Where the engine's work runs (prefills, decodes of a turn alone, re-compressions): given a function, runs it and
// returns when it is done, rethrowing what it threw. Empty: in the calling thread. With the decode loop: on the loop's
// thread between its steps, so that one thread computes at a time on every core, as llama-server's one loop does
// (ggml's OpenMP teams of several threads would otherwise spin against each other on the same cores).
using engine_runner = std::function<void(const std::function<void()> &)>;

}  // namespace ecokv::serve
