#include "impl.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace ecokv {

namespace {
log_callback g_log_callback  = nullptr;
void *       g_log_user_data = nullptr;

std::string vformat(const char * fmt, va_list args) {
    va_list copy;
    va_copy(copy, args);
    const int n = std::vsnprintf(nullptr, 0, fmt, copy);
    va_end(copy);
    std::string out(n > 0 ? size_t(n) : 0, '\0');
    std::vsnprintf(out.data(), out.size() + 1, fmt, args);
    return out;
}
}  // namespace

void log_set(log_callback callback, void * user_data) {
    g_log_callback  = callback;
    g_log_user_data = user_data;
}

namespace detail {

void assert_fail(const char * file, int line, const char * expr) {
    std::fprintf(stderr, "%s:%d: ECOKV_ASSERT(%s) failed\n", file, line, expr);
    std::abort();
}

void log_line(log_level level, const char * fmt, ...) {
    if (g_log_callback == nullptr) {
        return;
    }
    va_list args;
    va_start(args, fmt);
    const std::string text = vformat(fmt, args);
    va_end(args);
    g_log_callback(level, text.c_str(), g_log_user_data);
}

std::string format(const char * fmt, ...) {
    va_list args;
    va_start(args, fmt);
    std::string text = vformat(fmt, args);
    va_end(args);
    return text;
}

}  // namespace detail
}  // namespace ecokv
