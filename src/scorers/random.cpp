// Random eviction baseline: uniform scores from a counter-based hash of (seed, layer, head, token), so the
// result depends on --seed only, not on thread scheduling.
#include "common.h"

namespace ecokv::scorers {
namespace {
uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

class random_scorer final : public scorer_i {
    void score(const head_input & in, std::span<double> out) const override {
        const uint64_t base = splitmix64(in.params.seed ^ splitmix64(uint64_t(in.il) << 32 | uint32_t(in.ig)));
        for (size_t j = 0; j < out.size(); ++j) {
            out[j] = double(splitmix64(base + j) >> 11) * 0x1p-53;
        }
    }
};
}  // namespace
scorer_ptr make_random() { return std::make_unique<random_scorer>(); }
}  // namespace ecokv::scorers
