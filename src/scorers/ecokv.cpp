// ECOKV: "Geometry-Aware KV Cache Eviction via Complementary Diversity Metrics" (seeds/ecokv-paper.txt),
// Algorithm 1 and Eqs. 1-7, as fixed by SPEC §5.1:
//   sC = (1 - c) / 2, sE = minmax(dE), Sdiv = alpha sE + (1 - alpha) sC,
//   rE = 2 - 2 sigmoid(DE / tau), lambda = beta rE + (1 - beta) rC,
//   S = lambda * rescale(minmax(Sdiv), Simp) + (1 - lambda) * Simp.
// Deliberate readings (SPEC §5.1): sC has the sign of a diversity (Alg. 1 step 3 lost its minus sign), and the
// scaling uses the mean of minmax(Sdiv), the quantity actually rescaled. Default window 4. --ecokv-weights figure3
// takes alpha and beta as the cosine weights (Figure 3's text), the other reading SPEC §5.2 measured to matter.
#include "ecokv.h"

#include "common.h"

#include <cmath>

namespace ecokv::scorers {

ecokv_terms ecokv_terms_of(const head_input & in) {
    // Figure 3's reading (SPEC §5.2): alpha and beta weight the cosine terms, the Euclidean ones the rest.
    const bool   eq    = in.params.ecokv_weights == ecokv_weights_kind::equations;
    const double alpha = eq ? in.params.alpha : 1.0 - in.params.alpha;
    const double beta  = eq ? in.params.beta : 1.0 - in.params.beta;
    const double tau   = in.params.tau > 0 ? in.params.tau : std::sqrt(double(in.cap.head_dim));

    ecokv_terms                 t;
    const kernels::key_geometry g  = geometry(in);
    const std::vector<double>   se = kernels::minmax(g.dist);
    t.simp                         = importance(in, attention(in));
    t.sdiv.resize(se.size());
    for (size_t j = 0; j < se.size(); ++j) {
        t.sdiv[j] = alpha * se[j] + (1.0 - alpha) * (1.0 - g.cos_mu[j]) / 2.0;
    }
    t.r_c       = g.rc;
    t.mean_dist = g.mean_dist;
    t.r_e       = 2.0 - 2.0 / (1.0 + std::exp(-g.mean_dist / tau));
    t.lambda    = beta * t.r_e + (1.0 - beta) * g.rc;
    return t;
}

namespace {
class ecokv_scorer final : public scorer_i {
    void score(const head_input & in, std::span<double> out) const override {
        const ecokv_terms   t           = ecokv_terms_of(in);
        std::vector<double> sdiv_scaled = kernels::minmax(t.sdiv);
        kernels::rescale(sdiv_scaled, t.simp);
        for (size_t j = 0; j < sdiv_scaled.size(); ++j) {
            out[j] = t.lambda * sdiv_scaled[j] + (1.0 - t.lambda) * t.simp[j];
        }
    }
};
}  // namespace
scorer_ptr make_ecokv() { return std::make_unique<ecokv_scorer>(); }
}  // namespace ecokv::scorers
