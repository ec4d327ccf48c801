// ecokv internals: run fn(i) for i in [0, n) on n_threads OpenMP threads; the first exception thrown by
// any task is rethrown on the caller's thread once all tasks have stopped.
#pragma once

#include <cstdint>
#include <exception>
#include <mutex>

namespace ecokv::kernels {

template <typename Fn> void parallel_for(int64_t n, int32_t n_threads, Fn && fn) {
    std::exception_ptr first;
    std::mutex         mutex;
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) if (n_threads > 1)
    for (int64_t i = 0; i < n; ++i) {
        try {
            fn(i);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex);
            if (!first) {
                first = std::current_exception();
            }
        }
    }
    if (first) {
        std::rethrow_exception(first);
    }
}

}  // namespace ecokv::kernels
