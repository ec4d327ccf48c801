// LOOK-M: "LOOK-M: Look-Once Optimization in KV Cache for Efficient Multimodal Long-Context Inference",
// arXiv:2406.18139. SPEC §6: uniform budget C = B - N; text tokens of P rank before every image token, the
// scorer (default h2o) orders within a modality. Deviation: the original code keeps every text token whatever
// the budget (kv_token_merge/modify_llama.py); we keep the budget. Pivot merge: --merge pivot (merge.cpp).
#include "common.h"

namespace ecokv::allocators {
namespace {
class lookm final : public allocator_i {
    allocation allocate(const allocator_input & in) const override {
        allocation out = uniform_allocation(in);
        out.text_first = true;
        return out;
    }
};
}  // namespace
allocator_ptr make_lookm() { return std::make_unique<lookm>(); }
}  // namespace ecokv::allocators
