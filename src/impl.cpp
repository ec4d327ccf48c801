#include "impl.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace ecokv {

namespace {
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

namespace detail {

void assert_fail(const char * file, int line, const char * expr) {
    std::fprintf(stderr, "%s:%d: ECOKV_ASSERT(%s) failed\n", file, line, expr);
    std::abort();
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
