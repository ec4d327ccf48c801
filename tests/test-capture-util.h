// Shared by the core tests: a one-layer capture over caller-owned F32 arrays.
#pragma once

#include "ecokv/capture.h"

#include <cstdint>
#include <vector>

namespace ecokv::test {

inline capture_view make_capture(int32_t n_heads, int32_t n_kv_heads, int32_t d, int32_t t, int32_t nq,
                                 const std::vector<float> & keys, const std::vector<float> & values,
                                 const std::vector<float> & queries) {
    capture_view c;
    c.n_layers = 1, c.n_heads = n_heads, c.n_kv_heads = n_kv_heads, c.head_dim = d, c.head_dim_v = d;
    c.n_tokens = t, c.n_queries = nq;
    layer_capture lc;
    lc.keys    = tensor_view::packed(keys.data(), dtype::f32, { n_kv_heads, t, d });
    lc.values  = tensor_view::packed(values.data(), dtype::f32, { n_kv_heads, t, d });
    lc.queries = tensor_view::packed(queries.data(), dtype::f32, { n_heads, nq, d });
    c.layers.push_back(lc);
    return c;
}

}  // namespace ecokv::test
