// SparseMM: "SparseMM: Head Sparsity Emerges from Visual Concept Responses in MLLMs", arXiv:2506.05344.
// SPEC §6: static budgets from the official per-query-head visual scores (sparsemm_utils.py L456-493):
// s^ = s / sum s, S_{l,g} = sum_{h in g} s^_{l,h}, m = floor(C rho), C_{l,g} = round(S_{l,g} (C - m) L Hkv + m).
#include "common.h"
#include "io/head-scores.h"

#include <cmath>
#include <numeric>

namespace ecokv::allocators {
namespace {
class sparsemm final : public allocator_i {
    allocation allocate(const allocator_input & in) const override {
        const capture_view &      cap    = in.cap;
        const std::vector<double> scores = read_head_scores(in.params.head_scores, cap.n_layers, cap.n_heads);
        const double              total  = std::accumulate(scores.begin(), scores.end(), 0.0);
        const int32_t             c      = selectable(in);
        const double              m      = std::floor(c * floor_ratio(in, 0.1));
        const int32_t             group  = cap.n_heads / cap.n_kv_heads;
        const double              pool   = (c - m) * cap.n_layers * cap.n_kv_heads;
        allocation                out;
        for (int32_t il = 0; il < cap.n_layers; ++il) {
            for (int32_t ig = 0; ig < cap.n_kv_heads; ++ig) {
                double share = 0;
                for (int32_t h = ig * group; h < (ig + 1) * group; ++h) {
                    share += scores[size_t(il) * cap.n_heads + h] / total;
                }
                out.budget.push_back(int32_t(kernels::rint_even(share * pool + m)));
            }
        }
        return out;
    }
};
}  // namespace
allocator_ptr make_sparsemm() { return std::make_unique<sparsemm>(); }
}  // namespace ecokv::allocators
