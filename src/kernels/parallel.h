// ecokv internals: run fn(i) for i in [0, n) on n_threads OpenMP threads (0: all of them). If tasks throw,
// the exception of the lowest index is rethrown on the caller's thread once all tasks have stopped, so
// errors do not depend on scheduling.
#pragma once

#include <cstdint>
#include <exception>
#include <mutex>

#include <omp.h>

namespace ecokv::kernels {

template <typename Fn> void parallel_for(int64_t n, int32_t n_threads, Fn && fn) {
    std::exception_ptr first;
    int64_t            first_index = n;
    std::mutex         mutex;
    if (n_threads <= 0) {
        n_threads = omp_get_max_threads();
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) if (n_threads > 1)
    for (int64_t i = 0; i < n; ++i) {
        try {
            fn(i);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex);
            if (i < first_index) {
                first_index = i;
                first       = std::current_exception();
            }
        }
    }
    if (first) {
        std::rethrow_exception(first);
    }
}

}  // namespace ecokv::kernels
