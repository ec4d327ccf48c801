// AdaKV: "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation", arXiv:2407.11550.
// SPEC §6, MixKV/SparseMM AdaKVCluster convention (KV-head granularity, floor ratio 0.2, normalisation on,
// pooled window attention): per layer the heads compete for Hkv * C slots with their sorted scores;
// C_g = round(cnt_g (1 - alpha_f) + floor(C alpha_f)). The scorer then fills each head's C_g.
#include "common.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ecokv::allocators {
namespace {
struct entry {
    double  value;
    int32_t head;
    int32_t rank;  // position in the head's descending order
};

class adakv final : public allocator_i {
    allocation allocate(const allocator_input & in) const override {
        const int32_t c       = selectable(in);
        const int32_t n_heads = in.cap.n_kv_heads;
        const double  alpha_f = floor_ratio(in, 0.2);
        allocation    out;
        for (int32_t il = 0; il < in.cap.n_layers; ++il) {
            std::vector<entry> all;
            for (int32_t ig = 0; ig < n_heads; ++ig) {
                const head_stats &  st = in.stats[size_t(il) * n_heads + ig];
                std::vector<double> a  = kernels::pool(st.attn_raw, in.params.kernel, in.params.pool);
                std::sort(a.begin(), a.end(), std::greater<>());
                const double total = std::accumulate(a.begin(), a.end(), 0.0);
                const double top   = std::accumulate(a.begin(), a.begin() + std::min<size_t>(c, a.size()), 0.0);
                const double scale = total > 0 ? top / total : 0.0;
                for (int32_t r = 0; r < int32_t(a.size()); ++r) {
                    all.push_back({ a[r] * scale, ig, r });
                }
            }
            const size_t n_win = std::min(all.size(), size_t(n_heads) * c);
            std::partial_sort(all.begin(), all.begin() + n_win, all.end(), [](const entry & x, const entry & y) {
                if (x.value != y.value) {
                    return x.value > y.value;
                }
                return x.head != y.head ? x.head < y.head : x.rank < y.rank;
            });
            std::vector<int32_t> count(size_t(n_heads), 0);
            for (size_t i = 0; i < n_win; ++i) {
                ++count[all[i].head];
            }
            const double floor_part = std::floor(c * alpha_f);
            for (int32_t ig = 0; ig < n_heads; ++ig) {
                out.budget.push_back(int32_t(kernels::rint_even(count[ig] * (1.0 - alpha_f) + floor_part)));
            }
        }
        return out;
    }
};
}  // namespace
allocator_ptr make_adakv() { return std::make_unique<adakv>(); }
}  // namespace ecokv::allocators
