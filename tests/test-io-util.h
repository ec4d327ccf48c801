// Shared by the I/O tests (test-tensor, test-safetensors, test-capture, test-selection-json, test-synth): bytes
// and half-precision bits by hand, error checks, element decoding independent of the library's row_f32, and the
// small synthetic capture they write and read.
#pragma once

#include "ecokv/ecokv.h"
#include "test-util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

namespace ecokv::test {

inline uint64_t header_length_of(const std::string & file) {
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) {
        n |= uint64_t(static_cast<unsigned char>(file[i])) << (8 * i);
    }
    return n;
}

template <typename T> std::string raw(const std::vector<T> & v) {
    return std::string(reinterpret_cast<const char *>(v.data()), v.size() * sizeof(T));
}

inline uint16_t half_bits(_Float16 h) {
    uint16_t b;
    std::memcpy(&b, &h, 2);
    return b;
}

inline _Float16 half_of_bits(uint16_t b) {
    _Float16 h;
    std::memcpy(&h, &b, 2);
    return h;
}

// Runs fn, expects ecokv::error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()> & fn, std::initializer_list<std::string> parts) {
    try {
        fn();
    } catch (const ecokv::error & e) {
        const std::string msg = e.what();
        for (const std::string & p : parts) {
            EXPECT_NE(msg.find(p), std::string::npos) << "message \"" << msg << "\" lacks \"" << p << "\"";
        }
        return;
    } catch (const std::exception & e) {
        ADD_FAILURE() << "expected ecokv::error, got another exception: " << e.what();
        return;
    }
    ADD_FAILURE() << "expected ecokv::error, nothing was thrown";
}

// Every element of a [d2][d1][d0] F32 or F16 view, decoded with _Float16 (independent of row_f32).
inline std::vector<float> elements(const ecokv::tensor_view & v) {
    std::vector<float> out;
    for (int64_t i2 = 0; i2 < v.ne[2]; ++i2) {
        for (int64_t i1 = 0; i1 < v.ne[1]; ++i1) {
            const char * r = static_cast<const char *>(v.row(i1, i2));
            for (int64_t i0 = 0; i0 < v.ne[0]; ++i0) {
                if (v.type == ecokv::dtype::f32) {
                    float f;
                    std::memcpy(&f, r + 4 * i0, 4);
                    out.push_back(f);
                } else {
                    uint16_t h;
                    std::memcpy(&h, r + 2 * i0, 2);
                    out.push_back(float(half_of_bits(h)));
                }
            }
        }
    }
    return out;
}

inline ecokv::synth_params small_params(ecokv::dtype type = ecokv::dtype::f32, bool full = true) {
    ecokv::synth_params p;
    p.n_layers     = 2;
    p.n_heads      = 4;
    p.n_kv_heads   = 2;
    p.head_dim     = 8;
    p.head_dim_v   = 6;
    p.n_tokens     = 40;
    p.n_queries    = 32;
    p.full_queries = full;
    p.type         = type;
    p.seed         = 7;
    p.image_spans  = { { 5, 12 } };
    return p;
}

}  // namespace ecokv::test
