// MixKV: "Mixing Importance with Diversity Joint Optimization for KV Cache Compression in LVLMs",
// arXiv:2510.20707. SPEC §4-§5: S = rC * sC + (1 - rC) * (a + sV), sC = rescale(minmax(-c), a).
// Reference: mixkv_utils.py headwisemixkv L321-376. Deviation: rC is computed online per head and sample
// (the GUI-grounding fork, sparsemm_utils.py L360) instead of the official repo's static Qwen2-VL table.
// --mixkv-scale importance matches sC to mean(Simp) instead, as ECOKV's App. A.1 writes it (SPEC §5.2).
#include "common.h"

namespace ecokv::scorers {
namespace {
class mixkv final : public scorer_i {
    void score(const head_input & in, std::span<double> out) const override {
        const std::vector<double>   a    = attention(in);
        const std::vector<double>   simp = importance(in, a);
        const kernels::key_geometry g    = geometry(in);
        std::vector<double>         neg_c(g.cos_mu.size());
        for (size_t j = 0; j < neg_c.size(); ++j) {
            neg_c[j] = -g.cos_mu[j];
        }
        std::vector<double> sc = kernels::minmax(neg_c);
        kernels::rescale(sc, in.params.mixkv_scale == mixkv_scale_kind::attention ? a : simp);
        for (size_t j = 0; j < sc.size(); ++j) {
            out[j] = g.rc * sc[j] + (1.0 - g.rc) * simp[j];
        }
    }
};
}  // namespace
scorer_ptr make_mixkv() { return std::make_unique<mixkv>(); }
}  // namespace ecokv::scorers
