// Shared by the I/O tests (test-tensor, test-safetensors, test-capture, test-selection-json, test-synth): bytes
// and half-precision bits by hand, error checks, element decoding independent of the library's row_f32, and the
// small synthetic capture they write and read.
#pragma once

#include "ecokv/ecokv.h"
#include "test-util.h"

#include <gtest/gtest.h>

#include <cmath>
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

// The reference half conversions, independent of src/tensor.cpp: the compiler's _Float16 where it has one (GCC on
// x86-64), else plain arithmetic (frexp/ldexp, round half to even by nearbyint); clang 14 has no x86 _Float16.
#if defined(__FLT16_MANT_DIG__) && !defined(__clang__)
inline uint16_t half_bits(float x) {
    const _Float16 h = _Float16(x);
    uint16_t       b;
    std::memcpy(&b, &h, 2);
    return b;
}

inline float half_value(uint16_t b) {
    _Float16 h;
    std::memcpy(&h, &b, 2);
    return float(h);
}
#else
inline uint16_t half_bits(float x) {
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const float    a    = std::fabs(x);
    if (std::isnan(x)) {
        return sign | 0x7e00;
    }
    if (std::isinf(x)) {
        return sign | 0x7c00;
    }
    if (a < std::ldexp(1.0f, -14)) {  // subnormal: a multiple of 2^-24 (1024 of them is the smallest normal)
        return sign | uint16_t(std::nearbyint(a * std::ldexp(1.0f, 24)));
    }
    int         e        = 0;
    const float m        = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
    float       fraction = std::nearbyint((2 * m - 1) * 1024);
    int         biased   = e - 1 + 15;
    if (fraction == 1024) {
        fraction = 0;
        ++biased;
    }
    return biased >= 31 ? sign | 0x7c00 : sign | uint16_t(biased << 10) | uint16_t(fraction);
}

inline float half_value(uint16_t b) {
    const int   exponent = (b >> 10) & 31, fraction = b & 1023;
    const float v        = exponent == 0    ? std::ldexp(float(fraction), -24)
                           : exponent == 31 ? (fraction ? NAN : INFINITY)
                                            : std::ldexp(float(1024 + fraction), exponent - 25);
    return b & 0x8000 ? -v : v;
}
#endif

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

// Every element of a [d2][d1][d0] F32 or F16 view, decoded by half_value (independent of row_f32).
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
                    out.push_back(half_value(h));
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
