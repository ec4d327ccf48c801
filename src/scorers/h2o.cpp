// H2O: "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of LLMs", arXiv:2306.14048.
// SPEC §3.4: one-shot at prefill, S = accumulated causal attention of every prompt query, mean over the
// group, no pooling (KVCache-Factory H2OKVCluster after its causal-mask fix 9f9aa2e). Needs full queries.
#include "common.h"

namespace ecokv::scorers {
namespace {
class h2o final : public scorer_i {
    void score(const head_input & in, std::span<double> out) const override {
        std::copy(in.stats.attn_accum.begin(), in.stats.attn_accum.end(), out.begin());
    }
};
}  // namespace
scorer_ptr make_h2o() { return std::make_unique<h2o>(); }
}  // namespace ecokv::scorers
