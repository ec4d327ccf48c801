// Deterministic, platform-independent random numbers for the random-weight test models and the decode bench:
// a stream per (seed, tensor name), so weights do not depend on the order tensors are made in.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace ecokv::test {

// FNV-1a of a name, to derive a stream's seed from it. The offset is not FNV's standard basis: the test models'
// tolerances were set on the weights this one gives, so it stays.
inline uint64_t fnv1a(std::string_view s) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) {
        h = (h ^ c) * 0x100000001b3ull;
    }
    return h;
}

// splitmix64 stream with Box-Muller normals (std::normal_distribution differs across standard libraries).
struct splitmix64 {
    uint64_t state;

    uint64_t next() {
        uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z          = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z          = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }

    double uniform() { return double((next() >> 11) + 1) * 0x1.0p-53; }  // (0, 1]

    double normal() {  // one value per call
        const double u1 = uniform(), u2 = uniform();
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
};

}  // namespace ecokv::test
