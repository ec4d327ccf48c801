// SnapKV: "SnapKV: LLM Knows What You are Looking for Before Generation", arXiv:2404.14469.
// SPEC §3.1 / §5: S = avg-pooled window attention, MixKV convention (mean over window queries, mean over the
// GQA group, then pooling over P). Reference: MixKV mixkv/mixkv_utils.py SnapKVCluster L296-317.
// Deviation from the SnapKV repo: mean (not sum) over window queries and KV-head granularity, as MixKV.
#include "common.h"

namespace ecokv::scorers {
namespace {
class snapkv final : public scorer_i {
    void score(const head_input & in, std::span<double> out) const override { emit(out, attention(in)); }
};
}  // namespace
scorer_ptr make_snapkv() { return std::make_unique<snapkv>(); }
}  // namespace ecokv::scorers
