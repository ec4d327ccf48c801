// Shared by the core tests: a one-layer capture over caller-owned F32 arrays; a test codec for encoded rows.
#pragma once

#include "ecokv/capture.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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

// A test codec in the manner of llama.cpp's q8_0: blocks of 16 elements as an F32 scale d and 16 int8 q, x = q d.
inline constexpr int64_t k_block = 16;
inline constexpr size_t  k_block_bytes = sizeof(float) + k_block;

inline void decode_blocks(const void * row, float * out, int64_t n) {
    const auto * b = static_cast<const uint8_t *>(row);
    for (int64_t i = 0; i < n; i += k_block, b += k_block_bytes) {
        float d;
        std::memcpy(&d, b, sizeof d);
        for (int64_t j = 0; j < k_block; ++j) {
            out[i + j] = float(int8_t(b[sizeof d + j])) * d;
        }
    }
}

inline const row_codec k_codec{ "test8", k_block, k_block_bytes, decode_blocks };

struct encoded_tensor {
    std::vector<uint8_t> blocks;   // the encoded rows
    std::vector<float>   decoded;  // what they decode to, computed here independently of the codec
};

// Every row of v ([n2][n1][16 k]) encoded with d = max |x| / 127, q = round(x / d).
inline encoded_tensor encode(const tensor_view & v) {
    encoded_tensor     e;
    std::vector<float> row(size_t(v.ne[0]));
    for (int64_t i2 = 0; i2 < v.ne[2]; ++i2) {
        for (int64_t i1 = 0; i1 < v.ne[1]; ++i1) {
            v.row_f32(i1, i2, row.data());
            for (int64_t i = 0; i < v.ne[0]; i += k_block) {
                float amax = 0;
                for (int64_t j = 0; j < k_block; ++j) {
                    amax = std::max(amax, std::fabs(row[i + j]));
                }
                const float d = amax / 127;
                const auto  p = reinterpret_cast<const uint8_t *>(&d);
                e.blocks.insert(e.blocks.end(), p, p + sizeof d);
                for (int64_t j = 0; j < k_block; ++j) {
                    const int8_t q = int8_t(d > 0 ? std::lround(row[i + j] / d) : 0);
                    e.blocks.push_back(uint8_t(q));
                    e.decoded.push_back(float(q) * d);
                }
            }
        }
    }
    return e;
}

inline tensor_view encoded_view(const encoded_tensor & e, const tensor_view & like) {
    tensor_view v = like;
    v.data  = e.blocks.data();
    v.type  = dtype::encoded;
    v.codec = &k_codec;
    v.nb    = { 0, k_codec.row_bytes(like.ne[0]), k_codec.row_bytes(like.ne[0]) * size_t(like.ne[1]), 0 };
    v.nb[3] = v.nb[2] * size_t(like.ne[2]);
    return v;
}

}  // namespace ecokv::test
