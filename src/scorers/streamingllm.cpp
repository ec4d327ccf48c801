// StreamingLLM: "Efficient Streaming Language Models with Attention Sinks", arXiv:2309.17453.
// SPEC §5: keep the n_sink = 4 first tokens and the most recent B - 4. As a score over P: sinks first, then
// recency; with any window N <= B - n_sink the kept set is exactly sinks + the last B - n_sink tokens.
// Positions are not re-assigned (kvpress StreamingLLMPress without KeyRerotationPress).
#include "common.h"

namespace ecokv::scorers {
namespace {
class streamingllm final : public scorer_i {
    void score(const head_input & in, std::span<double> out) const override {
        const int32_t n = in.n_prefix();
        for (int32_t j = 0; j < n; ++j) {
            out[j] = j < in.params.n_sink ? 2.0 : double(j) / double(n);  // sinks tie: lower index first
        }
    }
};
}  // namespace
scorer_ptr make_streamingllm() { return std::make_unique<streamingllm>(); }
}  // namespace ecokv::scorers
