// H2O: "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of LLMs", arXiv:2306.14048.
// SPEC §3.4: one-shot at prefill, S = accumulated causal attention of every prompt query, mean over the
// group, no pooling (KVCache-Factory H2OKVCluster after its causal-mask fix 9f9aa2e). Needs full queries.
// Compressed again (chunks, answers, turns), each token's prior accumulated attention carries on (streaming H2O,
// the paper's own setting: scores accumulate as tokens are generated, an evicted token's are dropped).
#include "common.h"

namespace ecokv::scorers {
namespace {
class h2o final : public scorer_i {
    void score(const head_input & in, std::span<double> out) const override {
        std::copy_n(in.stats.attn_accum.begin(), out.size(), out.begin());  // the prefix's of every token's
    }
};
}  // namespace
scorer_ptr make_h2o() { return std::make_unique<h2o>(); }
}  // namespace ecokv::scorers
