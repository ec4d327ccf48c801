// ecokv serve: how the cores are shared among the work running now.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace ecokv::serve {

// The cores the work running now shares (ecokv serve -t 0): each decode asks threads(), cores / users, so that a
// lone request computes on every core and n users split them instead of each keeping cores / slots. A user is a
// request prefilling or decoding in its own context, or the decode loop while it holds sequences.
class core_share {
  public:
    explicit core_share(int32_t cores) : cores_(std::max(1, cores)) {}
    int32_t threads() const { return std::max(1, cores_ / std::max(1, users_.load())); }
    void    add_user(int32_t n) { users_ += n; }

  private:
    const int32_t        cores_;
    std::atomic<int32_t> users_{ 0 };
};

}  // namespace ecokv::serve
