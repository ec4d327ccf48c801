// ManifoldKV (arXiv:2602.08343; no public code): keys far from the key centroid are kept.
// SPEC §4: S = dE[j] = ||k[j] - kbar||, kbar the mean key over all T tokens.
#include "common.h"

namespace ecokv::scorers {
namespace {
class manifoldkv final : public scorer_i {
    void score(const head_input & in, std::span<double> out) const override { emit(out, geometry(in).dist); }
};
}  // namespace
scorer_ptr make_manifoldkv() { return std::make_unique<manifoldkv>(); }
}  // namespace ecokv::scorers
