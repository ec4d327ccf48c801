// ecokv internals: the splitmix64 finaliser, a counter-based hash for reproducible random streams that do not
// depend on generation order or thread scheduling.
#pragma once

#include <cstdint>

namespace ecokv::kernels {

inline uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

}  // namespace ecokv::kernels
