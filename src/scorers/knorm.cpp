// KNorm: "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression", arXiv:2406.11430.
// SPEC §3.3: `knorm` scores S = a + rescale(minmax0(-||k||), a) (MixKV's knorm branch, mixkv_utils.py);
// `knorm-only` is the paper's attention-free S = -||k|| (small key norms are the important ones).
#include "common.h"

namespace ecokv::scorers {
namespace {
std::vector<double> negative_key_norms(const head_input & in) {
    std::vector<double> n = kernels::row_norms(in.keys(), int32_t(in.slice()), in.n_prefix());
    for (double & v : n) {
        v = -v;
    }
    return n;
}

class knorm final : public scorer_i {
    void score(const head_input & in, std::span<double> out) const override {
        const std::vector<double> a  = attention(in);
        std::vector<double>       sk = kernels::minmax0(negative_key_norms(in));
        kernels::rescale(sk, a);
        for (size_t j = 0; j < sk.size(); ++j) {
            out[j] = a[j] + sk[j];
        }
    }
};

class knorm_only final : public scorer_i {
    void score(const head_input & in, std::span<double> out) const override { emit(out, negative_key_norms(in)); }
};
}  // namespace
scorer_ptr make_knorm() { return std::make_unique<knorm>(); }
scorer_ptr make_knorm_only() { return std::make_unique<knorm_only>(); }
}  // namespace ecokv::scorers
