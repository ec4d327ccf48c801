// ecokv: the splitmix64 finaliser (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
// OOPSLA 2014), a counter-based hash for reproducible random streams that depend neither on generation order nor
// on thread scheduling: synthetic captures (synth.h), the random scorer and the niah dataset generator of
// ecokv-eval draw from it, so the same seed gives the same bytes on every platform.
#pragma once

#include <cstdint>

namespace ecokv {

// Maps x to a well-mixed 64-bit value; splitmix64(seed + i), i = 0, 1, ..., is the generator's i-th output.
inline uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

}  // namespace ecokv
