// VNorm importance: InfiniPot-V (arXiv:2506.15745) as combined with attention by MixKV (arXiv:2510.20707).
// SPEC §3.2: S = Simp = a + rescale(minmax0(||v||), a). Reference: mixkv_utils.py L331-341, L375-376
// (min-max without eps, as there; a constant norm vector maps to zeros instead of NaN).
#include "common.h"

namespace ecokv::scorers {
namespace {
class vnorm final : public scorer_i {
    void score(const head_input & in, std::span<double> out) const override {
        emit(out, importance(in, attention(in)));
    }
};
}  // namespace
scorer_ptr make_vnorm() { return std::make_unique<vnorm>(); }
}  // namespace ecokv::scorers
