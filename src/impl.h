// ecokv internals: assertions, logging macros and string formatting.
#pragma once

#include "ecokv/error.h"
#include "ecokv/log.h"

#include <cstdarg>
#include <string>

namespace ecokv::detail {

[[noreturn]] void assert_fail(const char * file, int line, const char * expr);
void              log_line(log_level level, const char * fmt, ...) __attribute__((format(printf, 2, 3)));
std::string       format(const char * fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace ecokv::detail

// Aborts in every build type: for bugs, never for user input (user input throws ecokv::error).
#define ECOKV_ASSERT(x)                                          \
    do {                                                         \
        if (!(x)) {                                              \
            ::ecokv::detail::assert_fail(__FILE__, __LINE__, #x); \
        }                                                        \
    } while (0)

#define ECOKV_LOG_INFO(...)  ::ecokv::detail::log_line(::ecokv::log_level::info, __VA_ARGS__)
#define ECOKV_LOG_WARN(...)  ::ecokv::detail::log_line(::ecokv::log_level::warn, __VA_ARGS__)
#define ECOKV_LOG_ERROR(...) ::ecokv::detail::log_line(::ecokv::log_level::error, __VA_ARGS__)

// Throws ecokv::error with a printf-style message.
#define ECOKV_THROW(...) throw ::ecokv::error(::ecokv::detail::format(__VA_ARGS__))
