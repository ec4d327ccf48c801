// ECOKV's terms for one head (Algorithm 1, SPEC §5.1), shared by its scorer and the analyses (analysis.cpp).
#pragma once

#include "method-impl.h"

#include <vector>

namespace ecokv::scorers {

struct ecokv_terms {
    std::vector<double> simp;  // importance over P: pooled window attention + rescaled value norm
    std::vector<double> sdiv;  // diversity over P: alpha sE + (1 - alpha) sC (weights of the params' reading)
    double              r_c       = 0;  // mean cosine of distinct keys
    double              mean_dist = 0;  // DE
    double              r_e       = 0;  // 2 - 2 sigmoid(DE / tau)
    double              lambda    = 0;  // beta rE + (1 - beta) rC
};

ecokv_terms ecokv_terms_of(const head_input & in);

}  // namespace ecokv::scorers
