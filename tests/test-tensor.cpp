// Half-precision conversion and tensor views (F32, F16, U8; packed and strided).
//
// Expected values are computed independently of the code under test: GCC's _Float16 (under clang, plain arithmetic:
// test-io-util.h) for the half conversions, arithmetic by hand.
#include "ecokv/ecokv.h"

#include "test-io-util.h"
#include "test-util.h"

#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

using namespace ecokv::test;

// ---------------------------------------------------------------------------------------------------------------
// half precision

TEST(half, f16_to_f32_matches_float16_for_every_bit_pattern) {
    int n_nan = 0;
    for (uint32_t bits = 0; bits < 65536; ++bits) {
        const float expected = half_value(uint16_t(bits));
        const float got      = ecokv::f16_to_f32(uint16_t(bits));
        if (std::isnan(expected)) {
            ++n_nan;
            EXPECT_TRUE(std::isnan(got)) << std::hex << bits;
            EXPECT_EQ(std::signbit(expected), std::signbit(got)) << std::hex << bits;
        } else {
            // Bit equality: also distinguishes +0 from -0.
            EXPECT_EQ(std::bit_cast<uint32_t>(expected), std::bit_cast<uint32_t>(got)) << std::hex << bits;
        }
    }
    EXPECT_EQ(n_nan, 2 * 1023);  // exponent 31 with a non-zero mantissa, both signs
}

TEST(half, f16_to_f32_spot_values) {
    // By hand: 0x3c00 = 1, 0xc000 = -2, 0x7bff = 65504, 0x0001 = 2^-24, 0x0400 = 2^-14, 0x3555 ~ 1/3.
    EXPECT_EQ(ecokv::f16_to_f32(0x3c00), 1.0f);
    EXPECT_EQ(ecokv::f16_to_f32(0xc000), -2.0f);
    EXPECT_EQ(ecokv::f16_to_f32(0x7bff), 65504.0f);
    EXPECT_EQ(ecokv::f16_to_f32(0x0001), std::ldexp(1.0f, -24));
    EXPECT_EQ(ecokv::f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));
    EXPECT_EQ(ecokv::f16_to_f32(0x0400), std::ldexp(1.0f, -14));
    EXPECT_EQ(ecokv::f16_to_f32(0x3555), 1365.0f / 4096.0f);
    EXPECT_EQ(ecokv::f16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
    EXPECT_EQ(ecokv::f16_to_f32(0xfc00), -std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::signbit(ecokv::f16_to_f32(0x8000)));
}

void expect_f32_to_f16(float x) {
    const uint16_t got      = ecokv::f32_to_f16(x);
    const uint16_t expected = half_bits((x));
    if (std::isnan(x)) {
        EXPECT_TRUE((got & 0x7c00) == 0x7c00 && (got & 0x03ff) != 0) << "NaN became " << std::hex << got;
    } else {
        EXPECT_EQ(got, expected) << "x = " << x << " (bits " << std::hex << std::bit_cast<uint32_t>(x) << ")";
    }
}

TEST(half, f32_to_f16_exact_on_every_half_value) {
    for (uint32_t bits = 0; bits < 65536; ++bits) {
        const float h = half_value(uint16_t(bits));
        if (std::isnan(h)) {
            continue;
        }
        EXPECT_EQ(ecokv::f32_to_f16(h), uint16_t(bits)) << std::hex << bits;
    }
}

TEST(half, f32_to_f16_midpoints_round_to_even) {
    // Between every pair of neighbouring non-negative finite halves a < b: the exact midpoint (representable in
    // float: 12 significant bits) and the floats just below and above it, for both signs.
    int n_ties_down = 0, n_ties_up = 0;
    for (uint32_t bits = 0; bits < 0x7bff; ++bits) {
        const float a = half_value(uint16_t(bits));
        const float b = half_value(uint16_t(bits + 1));
        const float m = (a + b) / 2;  // exact
        ASSERT_EQ(double(m), (double(a) + double(b)) / 2);
        for (float x : { m, std::nextafter(m, 0.0f), std::nextafter(m, 1e9f) }) {
            expect_f32_to_f16(x);
            expect_f32_to_f16(-x);
        }
        // Ties to even: the even mantissa of a and b wins.
        const uint16_t got = ecokv::f32_to_f16(m);
        EXPECT_EQ(got, (bits % 2 == 0) ? bits : bits + 1) << std::hex << bits;
        (bits % 2 == 0 ? n_ties_down : n_ties_up)++;
    }
    EXPECT_GT(n_ties_down, 1000);
    EXPECT_GT(n_ties_up, 1000);
    // The largest half is 65504; 65520 is the midpoint to the next (65536 = inf) and rounds to even: inf.
    EXPECT_EQ(ecokv::f32_to_f16(65519.996f), 0x7bff);
    EXPECT_EQ(ecokv::f32_to_f16(65520.0f), 0x7c00);
    EXPECT_EQ(ecokv::f32_to_f16(-65520.0f), 0xfc00);
    expect_f32_to_f16(65520.0f);
    expect_f32_to_f16(std::nextafter(65520.0f, 0.0f));
}

TEST(half, f32_to_f16_random_floats) {
    std::mt19937_64 rng(12345);
    // Random bit patterns over the whole float range (most overflow to inf or underflow to 0).
    for (int i = 0; i < 300000; ++i) {
        expect_f32_to_f16(std::bit_cast<float>(uint32_t(rng())));
    }
    // Random mantissas at every exponent from well below the half subnormals to above the half range.
    for (int e = -30; e <= 17; ++e) {
        for (int i = 0; i < 4000; ++i) {
            const uint32_t mant = uint32_t(rng()) & 0x7fffff;
            const uint32_t sign = uint32_t(rng() & 1) << 31;
            expect_f32_to_f16(std::bit_cast<float>(sign | (uint32_t(e + 127) << 23) | mant));
        }
    }
    // Float subnormals all become (signed) zero.
    for (int i = 0; i < 10000; ++i) {
        const uint32_t mant = 1 + uint32_t(rng()) % 0x7fffff;
        expect_f32_to_f16(std::bit_cast<float>(mant));
        expect_f32_to_f16(std::bit_cast<float>(0x80000000u | mant));
    }
    EXPECT_EQ(ecokv::f32_to_f16(std::bit_cast<float>(0x00000001u)), 0x0000);
    EXPECT_EQ(ecokv::f32_to_f16(std::bit_cast<float>(0x80000001u)), 0x8000);
}

TEST(half, f32_to_f16_half_subnormals) {
    // Half subnormals are k * 2^-24; check k and the midpoints (k + 1/2) * 2^-24 (ties to even) by hand.
    for (int k = 0; k < 1024; ++k) {
        EXPECT_EQ(ecokv::f32_to_f16(std::ldexp(float(k), -24)), uint16_t(k));
        const uint16_t tie = ecokv::f32_to_f16(std::ldexp(float(k) + 0.5f, -24));
        EXPECT_EQ(tie, uint16_t(k % 2 == 0 ? k : k + 1)) << k;  // 1023.5 -> 1024 = 0x0400, the smallest normal
        expect_f32_to_f16(std::ldexp(float(k) + 0.25f, -24));
        expect_f32_to_f16(std::ldexp(float(k) + 0.75f, -24));
    }
    // Half of the smallest subnormal rounds to zero (tie, even), just above it to the smallest subnormal.
    EXPECT_EQ(ecokv::f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);
    EXPECT_EQ(ecokv::f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
}

TEST(half, f32_to_f16_special_values) {
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(ecokv::f32_to_f16(inf), 0x7c00);
    EXPECT_EQ(ecokv::f32_to_f16(-inf), 0xfc00);
    EXPECT_EQ(ecokv::f32_to_f16(1e10f), 0x7c00);
    EXPECT_EQ(ecokv::f32_to_f16(-3.4e38f), 0xfc00);
    EXPECT_EQ(ecokv::f32_to_f16(0.0f), 0x0000);
    EXPECT_EQ(ecokv::f32_to_f16(-0.0f), 0x8000);
    EXPECT_EQ(ecokv::f32_to_f16(1.0f), 0x3c00);
    EXPECT_EQ(ecokv::f32_to_f16(-2.0f), 0xc000);
    // NaN stays NaN, including NaNs whose payload lives only in the low mantissa bits that are dropped.
    for (uint32_t bits : { 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7f801000u, 0xff800fffu, 0x7fffffffu }) {
        const uint16_t h = ecokv::f32_to_f16(std::bit_cast<float>(bits));
        EXPECT_EQ(h & 0x7c00, 0x7c00) << std::hex << bits;
        EXPECT_NE(h & 0x03ff, 0) << std::hex << bits;
        EXPECT_TRUE(std::isnan(half_value(h))) << std::hex << bits;
        EXPECT_EQ(h >> 15, bits >> 31) << std::hex << bits;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// tensor views

TEST(tensor_view, packed_strides) {
    float data[2 * 3 * 4] = {};
    const auto v = ecokv::tensor_view::packed(data, ecokv::dtype::f32, { 2, 3, 4 });
    EXPECT_EQ(v.data, data);
    EXPECT_EQ(v.ne, (std::array<int64_t, 4>{ 4, 3, 2, 1 }));
    EXPECT_EQ(v.nb, (std::array<size_t, 4>{ 4, 16, 48, 96 }));
    EXPECT_EQ(v.n_elements(), 24);

    uint16_t h[5 * 7] = {};
    const auto vh = ecokv::tensor_view::packed(h, ecokv::dtype::f16, { 5, 7 });
    EXPECT_EQ(vh.ne, (std::array<int64_t, 4>{ 7, 5, 1, 1 }));
    EXPECT_EQ(vh.nb, (std::array<size_t, 4>{ 2, 14, 70, 70 }));

    uint8_t u[6] = {};
    const auto vu = ecokv::tensor_view::packed(u, ecokv::dtype::u8, { 6 });
    EXPECT_EQ(vu.ne, (std::array<int64_t, 4>{ 6, 1, 1, 1 }));
    EXPECT_EQ(vu.nb, (std::array<size_t, 4>{ 1, 6, 6, 6 }));

    const auto v4 = ecokv::tensor_view::packed(data, ecokv::dtype::f16, { 2, 1, 3, 2 });
    EXPECT_EQ(v4.ne, (std::array<int64_t, 4>{ 2, 3, 1, 2 }));
    EXPECT_EQ(v4.nb, (std::array<size_t, 4>{ 2, 4, 12, 12 }));

    EXPECT_EQ(ecokv::dtype_size(ecokv::dtype::f32), 4u);
    EXPECT_EQ(ecokv::dtype_size(ecokv::dtype::f16), 2u);
    EXPECT_EQ(ecokv::dtype_size(ecokv::dtype::u8), 1u);
    EXPECT_EQ(ecokv::dtype_name(ecokv::dtype::f32), "F32");
    EXPECT_EQ(ecokv::dtype_name(ecokv::dtype::f16), "F16");
    EXPECT_EQ(ecokv::dtype_name(ecokv::dtype::u8), "U8");
}

TEST(tensor_view, row_f32_f32) {
    // [2][3][4] with element (i2, i1, i0) = 100 * i2 + 10 * i1 + i0.
    std::vector<float> data;
    for (int i2 = 0; i2 < 2; ++i2) {
        for (int i1 = 0; i1 < 3; ++i1) {
            for (int i0 = 0; i0 < 4; ++i0) {
                data.push_back(float(100 * i2 + 10 * i1 + i0));
            }
        }
    }
    const auto v = ecokv::tensor_view::packed(data.data(), ecokv::dtype::f32, { 2, 3, 4 });
    float      out[4];
    for (int i2 = 0; i2 < 2; ++i2) {
        for (int i1 = 0; i1 < 3; ++i1) {
            v.row_f32(i1, i2, out);
            for (int i0 = 0; i0 < 4; ++i0) {
                EXPECT_EQ(out[i0], float(100 * i2 + 10 * i1 + i0));
            }
        }
    }
}

TEST(tensor_view, row_f32_f16) {
    // Halves of small integers and halves (exact): element (i2, i1, i0) = i2 * 8 + i1 * 2 + i0 * 0.5 - 5.
    std::vector<uint16_t> data;
    for (int i2 = 0; i2 < 3; ++i2) {
        for (int i1 = 0; i1 < 4; ++i1) {
            for (int i0 = 0; i0 < 5; ++i0) {
                data.push_back(half_bits((float(i2 * 8 + i1 * 2) + 0.5f * i0 - 5.0f)));
            }
        }
    }
    // One bit pattern by hand: 0x3c00 is 1.0, put it at (2, 3, 4).
    data[(2 * 4 + 3) * 5 + 4] = 0x3c00;
    const auto v = ecokv::tensor_view::packed(data.data(), ecokv::dtype::f16, { 3, 4, 5 });
    float      out[5];
    for (int i2 = 0; i2 < 3; ++i2) {
        for (int i1 = 0; i1 < 4; ++i1) {
            v.row_f32(i1, i2, out);
            for (int i0 = 0; i0 < 5; ++i0) {
                const float expected = (i2 == 2 && i1 == 3 && i0 == 4) ? 1.0f : float(i2 * 8 + i1 * 2) + 0.5f * i0 - 5.0f;
                EXPECT_EQ(out[i0], expected) << i2 << "," << i1 << "," << i0;
            }
        }
    }
}

TEST(tensor_view, row_f32_f16_every_bit_pattern) {
    // All 65536 halves through row_f32, in rows of 21 (vector blocks of 8 plus a tail of 5), against half_value.
    constexpr int64_t     width = 21, half = (65536 / width + 2) / 2;  // 2 * half rows cover 65536
    std::vector<uint16_t> data(size_t(2 * half * width), 0);
    for (uint32_t b = 0; b < 65536; ++b) {
        data[b] = uint16_t(b);
    }
    const auto         v = ecokv::tensor_view::packed(data.data(), ecokv::dtype::f16, { 2, half, width });
    std::vector<float> out(width);
    for (int64_t r = 0; r < 2 * half; ++r) {
        v.row_f32(r % half, r / half, out.data());
        for (int64_t i = 0; i < width; ++i) {
            const uint16_t b        = data[size_t(r * width + i)];
            const float    expected = half_value(b);
            if (std::isnan(expected)) {
                EXPECT_TRUE(std::isnan(out[i])) << std::hex << b;
            } else {
                EXPECT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(expected)) << std::hex << b;
            }
        }
    }
}

TEST(tensor_view, row_f32_u8) {
    std::vector<uint8_t> data(2 * 128);
    for (size_t i = 0; i < data.size(); ++i) {
        data[i] = uint8_t(i);
    }
    const auto v = ecokv::tensor_view::packed(data.data(), ecokv::dtype::u8, { 2, 128 });
    float      out[128];
    v.row_f32(1, 0, out);
    for (int i = 0; i < 128; ++i) {
        EXPECT_EQ(out[i], float(128 + i));
    }
    v.row_f32(0, 0, out);
    EXPECT_EQ(out[127], 127.0f);
}

TEST(tensor_view, row_f32_strided) {
    // A [heads=2][tokens=3][dim=2] view over a buffer laid out [tokens][heads][dim] (token-major, as engines do).
    std::vector<float> buf(3 * 2 * 2);
    for (int t = 0; t < 3; ++t) {
        for (int h = 0; h < 2; ++h) {
            for (int i = 0; i < 2; ++i) {
                buf[(t * 2 + h) * 2 + i] = float(100 * h + 10 * t + i);
            }
        }
    }
    ecokv::tensor_view v;
    v.data = buf.data();
    v.type = ecokv::dtype::f32;
    v.ne   = { 2, 3, 2, 1 };
    v.nb   = { 4, 16, 8, 48 };
    float out[2];
    for (int h = 0; h < 2; ++h) {
        for (int t = 0; t < 3; ++t) {
            v.row_f32(t, h, out);
            EXPECT_EQ(out[0], float(100 * h + 10 * t));
            EXPECT_EQ(out[1], float(100 * h + 10 * t + 1));
        }
    }
}

}  // namespace
