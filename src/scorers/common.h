// ecokv internals: score building blocks shared by several scorers (SPEC §3-§4).
#pragma once

#include "kernels/kernels.h"
#include "method-impl.h"

#include <algorithm>
#include <vector>

namespace ecokv::scorers {

// a: pooled window attention over P (SPEC §3.1).
inline std::vector<double> attention(const head_input & in) {
    return kernels::pool(in.stats.attn_raw, in.params.kernel, in.params.pool);
}

// Simp = a + sV, sV = rescale(minmax0(||v||), a) (SPEC §3.2).
inline std::vector<double> importance(const head_input & in, const std::vector<double> & a) {
    std::vector<double> sv = kernels::minmax0(kernels::row_norms(in.values(), int32_t(in.slice()), in.n_prefix()));
    kernels::rescale(sv, a);
    for (size_t j = 0; j < sv.size(); ++j) {
        sv[j] += a[j];
    }
    return sv;
}

// Key geometry with the centroid over all tokens (SPEC default) or over P only (--centroid prefix).
inline kernels::key_geometry geometry(const head_input & in) {
    const int32_t n_centroid = in.params.centroid == centroid_kind::all ? in.n_tokens() : in.n_prefix();
    return kernels::compute_key_geometry(in.keys(), int32_t(in.slice()), n_centroid, in.n_prefix());
}

inline void emit(std::span<double> out, const std::vector<double> & s) {
    std::copy(s.begin(), s.end(), out.begin());
}

}  // namespace ecokv::scorers
