// ecokv internals: helpers shared by the budget allocators (SPEC §6).
#pragma once

#include "kernels/kernels.h"
#include "method-impl.h"

namespace ecokv::allocators {

inline int32_t selectable(const allocator_input & in) { return in.params.budget - in.n_window; }  // C = B - N
inline int32_t n_prefix(const allocator_input & in) { return in.cap.n_tokens - in.n_window; }     // |P|
inline size_t  n_heads_total(const allocator_input & in) { return size_t(in.cap.n_layers) * in.cap.n_kv_heads; }

inline double floor_ratio(const allocator_input & in, double fallback) {
    return in.params.floor_ratio >= 0 ? in.params.floor_ratio : fallback;
}

inline allocation uniform_allocation(const allocator_input & in) {
    allocation out;
    out.budget.assign(n_heads_total(in), selectable(in));
    return out;
}

}  // namespace ecokv::allocators
