// ecokv internals: assertions, errors and string formatting. The library has no logging and prints nothing
// (a failed ECOKV_ASSERT excepted, just before it aborts): what a caller must know is returned or thrown.
#pragma once

#include "ecokv/error.h"

#include <cstdarg>
#include <string>

namespace ecokv::detail {

[[noreturn]] void assert_fail(const char * file, int line, const char * expr);
std::string       format(const char * fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace ecokv::detail

// Aborts in every build type: for bugs, never for user input (user input throws ecokv::error).
#define ECOKV_ASSERT(x)                                          \
    do {                                                         \
        if (!(x)) {                                              \
            ::ecokv::detail::assert_fail(__FILE__, __LINE__, #x); \
        }                                                        \
    } while (0)

// Throws ecokv::error with a printf-style message.
#define ECOKV_THROW(...) throw ::ecokv::error(::ecokv::detail::format(__VA_ARGS__))
