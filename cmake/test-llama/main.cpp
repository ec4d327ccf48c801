// Smoke test for cmake/llama.cmake: the public llama and mtmd APIs link and run.
#include <cstdio>
#include <cstring>

#include "llama.h"
#include "mtmd.h"

int main() {
    llama_backend_init();
    std::printf("system info: %s\n", llama_print_system_info());
    const char * marker = mtmd_default_marker();
    std::printf("mtmd default marker: %s\n", marker ? marker : "(null)");
    llama_backend_free();
    return (marker != nullptr && std::strlen(marker) > 0) ? 0 : 1;
}
