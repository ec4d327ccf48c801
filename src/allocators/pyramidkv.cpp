// PyramidKV: "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling",
// arXiv:2406.02069. SPEC §6, integer arithmetic exactly as KVCache-Factory pyramidkv_utils.py L173-283
// (pyram_mode variant of MixKV/SparseMM: no "N < 2(B - W)" middle branch). Layer 0 gets the most.
#include "common.h"

namespace ecokv::allocators {
namespace {
class pyramidkv final : public allocator_i {
    allocation allocate(const allocator_input & in) const override {
        const int32_t c = selectable(in);
        const int32_t l = in.cap.n_layers;
        int32_t       lo = c / in.params.pyramid_beta;
        int32_t       hi = 2 * c - lo;
        if (hi >= n_prefix(in)) {
            hi = n_prefix(in);
            lo = 2 * c - hi;
        }
        const int32_t step = l > 1 ? (hi - lo) / (l - 1) : 0;
        allocation    out;
        for (int32_t il = 0; il < l; ++il) {
            const int32_t c_l = l > 1 ? hi - il * step : c;
            out.budget.insert(out.budget.end(), size_t(in.cap.n_kv_heads), c_l);
        }
        return out;
    }
};
}  // namespace
allocator_ptr make_pyramidkv() { return std::make_unique<pyramidkv>(); }
}  // namespace ecokv::allocators
