// KeyDiff: "KeyDiff: Key Similarity-Based KV Cache Eviction", arXiv:2504.15364.
// SPEC §4: S = -cos(k, mu) scaled by ||mu|| (c[j] = kh[j] . mu, mu the mean normalised key over all T tokens,
// as kvpress keydiff_press.py). Attention-free; the window is kept but not used for scoring.
#include "common.h"

namespace ecokv::scorers {
namespace {
class keydiff final : public scorer_i {
    void score(const head_input & in, std::span<double> out) const override {
        const kernels::key_geometry g = geometry(in);
        for (size_t j = 0; j < g.cos_mu.size(); ++j) {
            out[j] = -g.cos_mu[j];
        }
    }
};
}  // namespace
scorer_ptr make_keydiff() { return std::make_unique<keydiff>(); }
}  // namespace ecokv::scorers
