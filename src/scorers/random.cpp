// Random eviction baseline: uniform scores from a counter-based hash of (seed, layer, head, token), so the
// result depends on --seed only, not on thread scheduling.
#include "common.h"
#include "kernels/hash.h"

namespace ecokv::scorers {
namespace {
using kernels::splitmix64;

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
