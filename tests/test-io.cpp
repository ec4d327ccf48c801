// I/O: half-precision conversion, tensor views, safetensors reading/writing (good and corrupt files), capture
// files (SPEC §7), atomic writes, the selection JSON and merged rows (SPEC §8), synthetic capture determinism.
//
// Expected values are computed independently of the code under test: GCC's _Float16 for the half conversions,
// bytes assembled by hand for safetensors files, nlohmann::json for parsing what we write, arithmetic by hand.
#include "ecokv/ecokv.h"

#include "test-util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <sstream>

namespace {

using namespace ecokv::test;
using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------------------------
// helpers


// A safetensors file assembled by hand: 8-byte little-endian header length, header text, data.
std::string safetensors_bytes(const std::string & header, const std::string & data) {
    std::string out;
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) {
        out.push_back(char((n >> (8 * i)) & 0xff));
    }
    return out + header + data;
}

uint64_t header_length_of(const std::string & file) {
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) {
        n |= uint64_t(static_cast<unsigned char>(file[i])) << (8 * i);
    }
    return n;
}

template <typename T> std::string raw(const std::vector<T> & v) {
    return std::string(reinterpret_cast<const char *>(v.data()), v.size() * sizeof(T));
}

template <typename T> std::vector<std::byte> to_bytes(const std::vector<T> & v) {
    std::vector<std::byte> out(v.size() * sizeof(T));
    std::memcpy(out.data(), v.data(), out.size());
    return out;
}

std::string bytes_str(std::span<const std::byte> b) {
    return std::string(reinterpret_cast<const char *>(b.data()), b.size());
}

uint16_t half_bits(_Float16 h) {
    uint16_t b;
    std::memcpy(&b, &h, 2);
    return b;
}

_Float16 half_of_bits(uint16_t b) {
    _Float16 h;
    std::memcpy(&h, &b, 2);
    return h;
}

// Runs fn, expects ecokv::error whose message contains every one of `parts`.
void expect_error(const std::function<void()> & fn, std::initializer_list<std::string> parts) {
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

// Byte-equality of two views of the same shape, row by row (handles any strides).
void expect_same_view(const ecokv::tensor_view & a, const ecokv::tensor_view & b, const std::string & what) {
    ASSERT_EQ(a.empty(), b.empty()) << what;
    if (a.empty()) {
        return;
    }
    ASSERT_EQ(a.type, b.type) << what;
    for (int d = 0; d < 4; ++d) {
        ASSERT_EQ(a.ne[d], b.ne[d]) << what << " ne[" << d << "]";
    }
    const size_t row_bytes = size_t(a.ne[0]) * ecokv::dtype_size(a.type);
    for (int64_t i3 = 0; i3 < a.ne[3]; ++i3) {
        for (int64_t i2 = 0; i2 < a.ne[2]; ++i2) {
            for (int64_t i1 = 0; i1 < a.ne[1]; ++i1) {
                ASSERT_EQ(0, std::memcmp(a.row(i1, i2, i3), b.row(i1, i2, i3), row_bytes))
                    << what << " row " << i1 << "," << i2 << "," << i3;
            }
        }
    }
}

// Every element of a [d2][d1][d0] F32 or F16 view, decoded with _Float16 (independent of row_f32).
std::vector<float> elements(const ecokv::tensor_view & v) {
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

ecokv::synth_params small_params(ecokv::dtype type = ecokv::dtype::f32, bool full = true) {
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

// Writes `cap` like write_capture, but lets a test drop tensors, replace tensors and change metadata, to build
// captures that write_capture (which validates) refuses to write.
struct raw_capture_edit {
    std::set<std::string>                                    drop;
    std::map<std::string, std::string>                       metadata;  // overrides; "" removes the key
    std::map<std::string, std::pair<std::vector<int64_t>, std::vector<std::byte>>> replace;  // F32 / U8 payloads
    bool                                                     modality_u8 = true;
};

void write_raw_capture(const std::string & path, const ecokv::capture_view & cap, const raw_capture_edit & edit) {
    ecokv::safetensors_writer w;
    auto add = [&](const std::string & name, const ecokv::tensor_view & v) {
        if (edit.drop.count(name)) {
            return;
        }
        if (auto it = edit.replace.find(name); it != edit.replace.end()) {
            w.add(name, ecokv::dtype::f32, it->second.first, it->second.second);
            return;
        }
        w.add(name, v, 3);
    };
    for (int32_t il = 0; il < cap.n_layers; ++il) {
        const std::string p = "layers." + std::to_string(il) + ".";
        add(p + "keys", cap.layers[il].keys);
        add(p + "values", cap.layers[il].values);
        add(p + "queries", cap.layers[il].queries);
        if (!cap.layers[il].full_queries.empty()) {
            add(p + "full_queries", cap.layers[il].full_queries);
        }
    }
    if (auto it = edit.replace.find("modality"); it != edit.replace.end()) {
        w.add("modality", ecokv::dtype::u8, it->second.first, it->second.second);
    } else if (!cap.modality.empty() && !edit.drop.count("modality")) {
        std::vector<std::byte> m(cap.modality.size());
        std::memcpy(m.data(), cap.modality.data(), m.size());
        w.add("modality", ecokv::dtype::u8, { int64_t(m.size()) }, m);
    }
    std::map<std::string, std::string> md = {
        { "n_layers", std::to_string(cap.n_layers) },     { "n_heads", std::to_string(cap.n_heads) },
        { "n_kv_heads", std::to_string(cap.n_kv_heads) }, { "head_dim", std::to_string(cap.head_dim) },
        { "n_tokens", std::to_string(cap.n_tokens) },
    };
    for (const auto & [k, v] : edit.metadata) {
        if (v.empty()) {
            md.erase(k);
        } else {
            md[k] = v;
        }
    }
    for (const auto & [k, v] : md) {
        w.set_metadata(k, v);
    }
    w.write(path);
}

// ---------------------------------------------------------------------------------------------------------------
// half precision

TEST(half, f16_to_f32_matches_float16_for_every_bit_pattern) {
    int n_nan = 0;
    for (uint32_t bits = 0; bits < 65536; ++bits) {
        const float expected = float(half_of_bits(uint16_t(bits)));
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
    const uint16_t expected = half_bits(_Float16(x));
    if (std::isnan(x)) {
        EXPECT_TRUE((got & 0x7c00) == 0x7c00 && (got & 0x03ff) != 0) << "NaN became " << std::hex << got;
    } else {
        EXPECT_EQ(got, expected) << "x = " << x << " (bits " << std::hex << std::bit_cast<uint32_t>(x) << ")";
    }
}

TEST(half, f32_to_f16_exact_on_every_half_value) {
    for (uint32_t bits = 0; bits < 65536; ++bits) {
        const _Float16 h = half_of_bits(uint16_t(bits));
        if (std::isnan(float(h))) {
            continue;
        }
        EXPECT_EQ(ecokv::f32_to_f16(float(h)), uint16_t(bits)) << std::hex << bits;
    }
}

TEST(half, f32_to_f16_midpoints_round_to_even) {
    // Between every pair of neighbouring non-negative finite halves a < b: the exact midpoint (representable in
    // float: 12 significant bits) and the floats just below and above it, for both signs.
    int n_ties_down = 0, n_ties_up = 0;
    for (uint32_t bits = 0; bits < 0x7bff; ++bits) {
        const float a = float(half_of_bits(uint16_t(bits)));
        const float b = float(half_of_bits(uint16_t(bits + 1)));
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
        EXPECT_TRUE(std::isnan(float(half_of_bits(h)))) << std::hex << bits;
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
                data.push_back(half_bits(_Float16(float(i2 * 8 + i1 * 2) + 0.5f * i0 - 5.0f)));
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
    // All 65536 halves through row_f32, in rows of 21 (vector blocks of 8 plus a tail of 5), against _Float16.
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
            const float    expected = float(half_of_bits(b));
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

// ---------------------------------------------------------------------------------------------------------------
// safetensors

TEST(safetensors, round_trip) {
    temp_dir                dir;
    const std::string       path = dir / "a.safetensors";
    const std::vector<float> f32 = { 1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f };
    const std::vector<uint16_t> f16 = { 0x3c00, 0xc000, 0x7bff, 0x0001 };
    const std::vector<uint8_t>  u8  = { 0, 1, 2, 250, 255, 7 };
    // A strided source: a [2][3] view taking every other float of a 12-float buffer row-wise.
    std::vector<float> wide(2 * 6);
    for (size_t i = 0; i < wide.size(); ++i) {
        wide[i] = float(i) * 0.5f;
    }
    ecokv::tensor_view strided;
    strided.data = wide.data();
    strided.type = ecokv::dtype::f32;
    strided.ne   = { 3, 2, 1, 1 };
    strided.nb   = { 4, 24, 48, 48 };

    ecokv::safetensors_writer w;
    w.add("f32", ecokv::dtype::f32, { 2, 3 }, to_bytes(f32));
    w.add("half", ecokv::dtype::f16, { 4 }, to_bytes(f16));
    w.add("bytes", ecokv::dtype::u8, { 3, 1, 2 }, to_bytes(u8));
    w.add("view", strided, 2);
    w.set_metadata("model", "unit-test");
    w.set_metadata("n", "42");
    w.write(path);

    // The file, read by hand: header length is a multiple of 8 and the data follows it exactly.
    const std::string file     = read_file(path);
    const uint64_t    n_header = header_length_of(file);
    EXPECT_EQ(n_header % 8, 0u);
    const size_t n_data = 4 * 6 + 2 * 4 + 6 + 4 * 6;
    ASSERT_EQ(file.size(), 8 + n_header + n_data);
    const json header = json::parse(file.substr(8, n_header));
    EXPECT_EQ(header["__metadata__"], (json{ { "model", "unit-test" }, { "n", "42" } }));
    EXPECT_EQ(header["f32"]["dtype"], "F32");
    EXPECT_EQ(header["f32"]["shape"], (json{ 2, 3 }));
    EXPECT_EQ(header["half"]["dtype"], "F16");
    EXPECT_EQ(header["bytes"]["dtype"], "U8");
    EXPECT_EQ(header["bytes"]["shape"], (json{ 3, 1, 2 }));
    EXPECT_EQ(header["view"]["shape"], (json{ 2, 3 }));
    auto data_of = [&](const char * name) {
        const uint64_t b = header[name]["data_offsets"][0], e = header[name]["data_offsets"][1];
        return file.substr(8 + n_header + b, e - b);
    };
    EXPECT_EQ(data_of("f32"), raw(f32));
    EXPECT_EQ(data_of("half"), raw(f16));
    EXPECT_EQ(data_of("bytes"), raw(u8));
    EXPECT_EQ(data_of("view"), raw(std::vector<float>{ 0.0f, 0.5f, 1.0f, 3.0f, 3.5f, 4.0f }));

    // The same, through our reader.
    const auto f = ecokv::safetensors_file::open(path);
    EXPECT_EQ(f.path(), path);
    EXPECT_EQ(f.tensors().size(), 4u);
    EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{ { "model", "unit-test" }, { "n", "42" } }));
    const auto * t = f.find("f32");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, ecokv::dtype::f32);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{ 2, 3 }));
    EXPECT_EQ(bytes_str(t->bytes), raw(f32));
    const auto tv = t->view();
    EXPECT_EQ(tv.ne, (std::array<int64_t, 4>{ 3, 2, 1, 1 }));
    EXPECT_EQ(tv.nb, (std::array<size_t, 4>{ 4, 12, 24, 24 }));
    float row[3];
    tv.row_f32(1, 0, row);
    EXPECT_EQ(row[0], 0.0f);
    EXPECT_EQ(row[2], 1e-30f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->bytes.data()) % 4, 0u);  // 8-aligned header keeps data aligned
    t = f.find("half");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, ecokv::dtype::f16);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{ 4 }));
    EXPECT_EQ(bytes_str(t->bytes), raw(f16));
    t = f.find("bytes");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, ecokv::dtype::u8);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{ 3, 1, 2 }));
    EXPECT_EQ(bytes_str(t->bytes), raw(u8));
    EXPECT_EQ(t->view().ne, (std::array<int64_t, 4>{ 2, 1, 3, 1 }));
    EXPECT_EQ(f.find("missing"), nullptr);
    EXPECT_EQ(dir.list(), (std::set<std::string>{ "a.safetensors" }));
}

TEST(safetensors, header_padding_for_every_length) {
    // Tensor names of growing length move the header size through every residue mod 8.
    temp_dir dir;
    for (int n = 1; n <= 16; ++n) {
        ecokv::safetensors_writer w;
        w.add(std::string(size_t(n), 'x'), ecokv::dtype::u8, { 3 }, to_bytes(std::vector<uint8_t>{ 1, 2, 3 }));
        const std::string path = dir / ("p" + std::to_string(n) + ".safetensors");
        w.write(path);
        const std::string file = read_file(path);
        const uint64_t    nh   = header_length_of(file);
        EXPECT_EQ(nh % 8, 0u) << n;
        ASSERT_EQ(file.size(), 8 + nh + 3) << n;
        EXPECT_EQ(file.substr(8 + nh), std::string("\x01\x02\x03", 3));
        EXPECT_NO_THROW(json::parse(file.substr(8, nh))) << n;
        const auto f = ecokv::safetensors_file::open(path);
        ASSERT_EQ(f.tensors().size(), 1u);
        EXPECT_EQ(f.tensors()[0].name, std::string(size_t(n), 'x'));
        EXPECT_TRUE(f.metadata().empty());
    }
}

TEST(safetensors, reads_a_file_written_by_hand) {
    temp_dir dir;
    // Header of odd length (not padded), data of "b" stored before "a", a scalar, a zero-size tensor and
    // extra keys in __metadata__.
    const std::string header =
        R"({"a":{"dtype":"F16","shape":[2,2],"data_offsets":[8,16]},)"
        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
        R"("s":{"dtype":"U8","shape":[],"data_offsets":[16,17]},)"
        R"("z":{"dtype":"F32","shape":[0,3],"data_offsets":[17,17]},)"
        R"("__metadata__":{"format":"pt","k":"v w"}})";
    std::string data;
    const float b[2] = { 2.5f, -1.0f };  // 0x40200000, 0xbf800000
    data.append(reinterpret_cast<const char *>(b), 8);
    // a = [[1, -2], [65504, 2^-24]] in half: 0x3c00 0xc000 0x7bff 0x0001, little-endian.
    data.append("\x00\x3c\x00\xc0\xff\x7b\x01\x00", 8);
    data.push_back('\x2a');
    const std::string path = dir / "hand.safetensors";
    write_file(path, safetensors_bytes(header, data));

    const auto f = ecokv::safetensors_file::open(path);
    ASSERT_EQ(f.tensors().size(), 4u);
    EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{ { "format", "pt" }, { "k", "v w" } }));
    const auto * a = f.find("a");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->type, ecokv::dtype::f16);
    EXPECT_EQ(a->shape, (std::vector<int64_t>{ 2, 2 }));
    float row[2];
    a->view().row_f32(0, 0, row);
    EXPECT_EQ(row[0], 1.0f);
    EXPECT_EQ(row[1], -2.0f);
    a->view().row_f32(1, 0, row);
    EXPECT_EQ(row[0], 65504.0f);
    EXPECT_EQ(row[1], std::ldexp(1.0f, -24));
    const auto * bt = f.find("b");
    ASSERT_NE(bt, nullptr);
    EXPECT_EQ(bt->type, ecokv::dtype::f32);
    bt->view().row_f32(0, 0, row);
    EXPECT_EQ(row[0], 2.5f);
    EXPECT_EQ(row[1], -1.0f);
    const auto * s = f.find("s");
    ASSERT_NE(s, nullptr);
    EXPECT_TRUE(s->shape.empty());
    ASSERT_EQ(s->bytes.size(), 1u);
    EXPECT_EQ(std::to_integer<int>(s->bytes[0]), 42);
    EXPECT_EQ(s->view().n_elements(), 1);  // a scalar holds one element
    const auto * z = f.find("z");
    ASSERT_NE(z, nullptr);
    EXPECT_EQ(z->bytes.size(), 0u);
    EXPECT_EQ(z->view().n_elements(), 0);
}

TEST(safetensors, reads_the_golden_capture_header) {
    // tests/data/golden/tiny-f32.safetensors: 3 layers, 4 heads, 2 KV heads, head_dim 8, 56 tokens.
    const auto f = ecokv::safetensors_file::open(std::string(ECOKV_TEST_DATA) + "/golden/tiny-f32.safetensors");
    EXPECT_EQ(f.metadata().at("n_tokens"), "56");
    EXPECT_EQ(f.tensors().size(), 3u * 4 + 1);
    const auto * k = f.find("layers.2.keys");
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(k->shape, (std::vector<int64_t>{ 2, 56, 8 }));
    EXPECT_EQ(k->bytes.size(), 2u * 56 * 8 * 4);
}

struct corrupt_case {
    const char * name;
    std::string  bytes;
    std::vector<std::string> message;  // substrings besides the file name
};

std::string valid_data_file() {
    return safetensors_bytes(R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", std::string(16, '\0'));
}

TEST(safetensors, corrupt_files_name_the_file) {
    const std::string ok = valid_data_file();
    std::string big_len = ok;
    big_len[0]          = char(0xff);  // header length 0x...ff, far past the end
    std::string huge_len(8, char(0xff));
    huge_len += "{}";
    const std::vector<corrupt_case> cases = {
        { "empty", "", { "empty" } },
        { "short", std::string("\x08\x00\x00", 3), { "truncated" } },
        { "seven", std::string(7, '\0'), { "truncated" } },
        { "header-too-long", big_len, { "header length", "exceeds" } },
        { "header-u64-max", huge_len, { "header length" } },
        { "header-past-end", safetensors_bytes("{}", "").substr(0, 9), { "header length" } },
        { "not-json", safetensors_bytes("{\"t\": nope}", ""), { "not valid JSON" } },
        { "not-object", safetensors_bytes("[1, 2, 3]", ""), { "not a JSON object" } },
        { "bf16", safetensors_bytes(R"({"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})", std::string(4, '\0')),
          { "'w'", "BF16", "unsupported dtype" } },
        { "i64", safetensors_bytes(R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0')),
          { "'w'", "I64" } },
        { "size-mismatch",
          safetensors_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
          { "'w'", "8 bytes", "need 12" } },
        { "size-mismatch-f16",
          safetensors_bytes(R"({"w":{"dtype":"F16","shape":[2,2],"data_offsets":[0,16]}})", std::string(16, '\0')),
          { "'w'", "16 bytes", "need 8" } },
        { "offsets-beyond-data", ok.substr(0, ok.size() - 4), { "'t'", "outside", "truncated" } },
        { "offsets-reversed",
          safetensors_bytes(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})", std::string(4, '\0')),
          { "'w'", "outside" } },
        { "overlap",
          safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                            std::string(12, '\0')),
          { "overlap" } },
        { "metadata-number", safetensors_bytes(R"({"__metadata__":{"n_layers":3}})", ""), { "__metadata__", "n_layers" } },
        { "metadata-array", safetensors_bytes(R"({"__metadata__":["a"]})", ""), { "__metadata__" } },
        { "no-offsets", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1]}})", std::string(4, '\0')),
          { "'w'", "data_offsets" } },
        { "negative-dim",
          safetensors_bytes(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, '\0')),
          { "'w'", "dimension" } },
        { "five-dims",
          safetensors_bytes(R"({"w":{"dtype":"U8","shape":[1,1,1,1,1],"data_offsets":[0,1]}})", std::string(1, '\0')),
          { "'w'", "shape" } },
        // 2^40 * 2^24 elements: the element count wraps to 0 in 64 bits and would match an empty range.
        { "shape-overflow",
          safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1099511627776,16777216],"data_offsets":[0,0]}})", ""),
          { "'w'", "too large" } },
        { "shape-overflow-bytes",
          safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1099511627776,4194304],"data_offsets":[0,0]}})", ""),
          { "'w'", "too large" } },
    };
    temp_dir dir;
    for (const corrupt_case & c : cases) {
        SCOPED_TRACE(c.name);
        const std::string path = dir / (std::string(c.name) + ".safetensors");
        write_file(path, c.bytes);
        std::vector<std::string> parts = c.message;
        parts.push_back(path);
        try {
            (void) ecokv::safetensors_file::open(path);
            ADD_FAILURE() << "no error";
        } catch (const ecokv::error & e) {
            const std::string msg = e.what();
            for (const std::string & p : parts) {
                EXPECT_NE(msg.find(p), std::string::npos) << "message \"" << msg << "\" lacks \"" << p << "\"";
            }
        }
    }
}

TEST(safetensors, missing_file_and_directory) {
    temp_dir          dir;
    const std::string missing = dir / "nope.safetensors";
    expect_error([&] { (void) ecokv::safetensors_file::open(missing); }, { missing, "cannot open" });
    const std::string sub = dir / "subdir";
    fs::create_directory(sub);
    expect_error([&] { (void) ecokv::safetensors_file::open(sub); }, { sub, "not a regular file" });
}

TEST(safetensors, zero_dimension_with_large_other_dimension_is_fine) {
    // A dimension of 0 makes the tensor empty however large the others are.
    temp_dir          dir;
    const std::string path = dir / "z.safetensors";
    write_file(path, safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1099511627776,1099511627776,0],"data_offsets":[0,0]}})", ""));
    const auto f = ecokv::safetensors_file::open(path);
    ASSERT_NE(f.find("w"), nullptr);
    EXPECT_EQ(f.find("w")->bytes.size(), 0u);
}

// ---------------------------------------------------------------------------------------------------------------
// capture files

void expect_capture_equal(const ecokv::capture_view & got, const ecokv::capture_view & want) {
    EXPECT_EQ(got.n_layers, want.n_layers);
    EXPECT_EQ(got.n_heads, want.n_heads);
    EXPECT_EQ(got.n_kv_heads, want.n_kv_heads);
    EXPECT_EQ(got.head_dim, want.head_dim);
    EXPECT_EQ(got.head_dim_v, want.head_dim_v);
    EXPECT_EQ(got.n_tokens, want.n_tokens);
    EXPECT_EQ(got.n_queries, want.n_queries);
    EXPECT_EQ(got.modality, want.modality);
    EXPECT_EQ(got.model, want.model);
    ASSERT_EQ(got.layers.size(), want.layers.size());
    for (size_t il = 0; il < got.layers.size(); ++il) {
        const std::string p = "layer " + std::to_string(il);
        expect_same_view(got.layers[il].keys, want.layers[il].keys, p + " keys");
        expect_same_view(got.layers[il].values, want.layers[il].values, p + " values");
        expect_same_view(got.layers[il].queries, want.layers[il].queries, p + " queries");
        expect_same_view(got.layers[il].full_queries, want.layers[il].full_queries, p + " full_queries");
        // And element by element as numbers.
        EXPECT_EQ(elements(got.layers[il].keys), elements(want.layers[il].keys)) << p;
        EXPECT_EQ(elements(got.layers[il].values), elements(want.layers[il].values)) << p;
        EXPECT_EQ(elements(got.layers[il].queries), elements(want.layers[il].queries)) << p;
        if (!want.layers[il].full_queries.empty()) {
            EXPECT_EQ(elements(got.layers[il].full_queries), elements(want.layers[il].full_queries)) << p;
        }
    }
}

TEST(capture, round_trip_f32_and_f16) {
    temp_dir dir;
    for (ecokv::dtype type : { ecokv::dtype::f32, ecokv::dtype::f16 }) {
        for (bool full : { true, false }) {
            SCOPED_TRACE(std::string(ecokv::dtype_name(type)) + (full ? " full" : " window"));
            const ecokv::synth_params  p   = small_params(type, full);
            const ecokv::owned_capture cap = ecokv::make_synth_capture(p);
            const std::string path = dir / (std::string(ecokv::dtype_name(type)) + (full ? "-full" : "") + ".safetensors");
            ecokv::write_capture(path, cap.view(), { { "generator", "test" } });
            const auto f = ecokv::capture_file::open(path);
            const auto & v = f.view();
            // Dimensions against the parameters, not against the in-memory capture alone.
            EXPECT_EQ(v.n_layers, 2);
            EXPECT_EQ(v.n_heads, 4);
            EXPECT_EQ(v.n_kv_heads, 2);
            EXPECT_EQ(v.head_dim, 8);
            EXPECT_EQ(v.head_dim_v, 6);
            EXPECT_EQ(v.n_tokens, 40);
            EXPECT_EQ(v.n_queries, 32);
            EXPECT_EQ(v.has_full_queries(), full);
            EXPECT_EQ(v.layers[1].keys.type, type);
            std::vector<uint8_t> modality(40, 0);
            std::fill(modality.begin() + 5, modality.begin() + 12, uint8_t(1));
            EXPECT_EQ(v.modality, modality);
            EXPECT_TRUE(v.is_text(4));
            EXPECT_FALSE(v.is_text(5));
            EXPECT_FALSE(v.is_text(11));
            EXPECT_TRUE(v.is_text(12));
            EXPECT_EQ(v.model, "synthetic");
            EXPECT_EQ(f.metadata().at("generator"), "test");
            EXPECT_EQ(f.metadata().at("n_layers"), "2");
            EXPECT_EQ(f.metadata().at("n_tokens"), "40");
            expect_capture_equal(v, cap.view());
            EXPECT_NO_THROW(v.validate());
            EXPECT_NO_THROW(v.check_finite());
        }
    }
    // Nothing but the four captures in the directory.
    EXPECT_EQ(dir.list().size(), 4u);
}

TEST(capture, golden_tiny_opens) {
    const auto   f = ecokv::capture_file::open(std::string(ECOKV_TEST_DATA) + "/golden/tiny-f32.safetensors");
    const auto & v = f.view();
    EXPECT_EQ(v.n_layers, 3);
    EXPECT_EQ(v.n_heads, 4);
    EXPECT_EQ(v.n_kv_heads, 2);
    EXPECT_EQ(v.head_dim, 8);
    EXPECT_EQ(v.head_dim_v, 8);
    EXPECT_EQ(v.n_tokens, 56);
    EXPECT_EQ(v.n_queries, 32);
    EXPECT_TRUE(v.has_full_queries());
    EXPECT_EQ(v.modality.size(), 56u);
    EXPECT_EQ(v.model, "synthetic-tiny");
    EXPECT_NO_THROW(v.check_finite());
}

struct bad_capture_case {
    const char *             name;
    raw_capture_edit         edit;
    std::vector<std::string> message;
};

std::vector<std::byte> f32_zeros(size_t n) {
    return std::vector<std::byte>(n * 4, std::byte{ 0 });
}

TEST(capture, bad_captures_name_the_file_and_the_problem) {
    const ecokv::owned_capture cap = ecokv::make_synth_capture(small_params());
    // Dimensions: L 2, H 4, Hkv 2, D 8, Dv 6, T 40, Nq 32.
    std::vector<bad_capture_case> cases;
    {
        bad_capture_case c{ "missing-metadata", {}, { "n_kv_heads" } };
        c.edit.metadata["n_kv_heads"] = "";
        cases.push_back(c);
    }
    {
        bad_capture_case c{ "metadata-not-integer", {}, { "n_tokens", "forty" } };
        c.edit.metadata["n_tokens"] = "forty";
        cases.push_back(c);
    }
    {
        bad_capture_case c{ "metadata-zero", {}, { "n_layers" } };
        c.edit.metadata["n_layers"] = "0";
        cases.push_back(c);
    }
    {
        bad_capture_case c{ "missing-values", {}, { "layers.1.values", "missing" } };
        c.edit.drop.insert("layers.1.values");
        cases.push_back(c);
    }
    {
        bad_capture_case c{ "missing-layer", {}, { "layers.2.keys", "missing" } };
        c.edit.metadata["n_layers"] = "3";
        cases.push_back(c);
    }
    {
        bad_capture_case c{ "keys-too-long", {}, { "layers.0.keys", "[2, 41, 8]", "[2, 40, 8]" } };
        c.edit.replace["layers.0.keys"] = { { 2, 41, 8 }, f32_zeros(2 * 41 * 8) };
        cases.push_back(c);
    }
    {
        bad_capture_case c{ "keys-wrong-dim", {}, { "layers.1.keys" } };
        c.edit.replace["layers.1.keys"] = { { 2, 40, 4 }, f32_zeros(2 * 40 * 4) };
        cases.push_back(c);
    }
    {
        bad_capture_case c{ "keys-two-dims", {}, { "layers.0.keys", "3 dimensions" } };
        c.edit.replace["layers.0.keys"] = { { 80, 8 }, f32_zeros(80 * 8) };
        cases.push_back(c);
    }
    {
        bad_capture_case c{ "values-wrong-tokens", {}, { "layers.1.values" } };
        c.edit.replace["layers.1.values"] = { { 2, 39, 6 }, f32_zeros(2 * 39 * 6) };
        cases.push_back(c);
    }
    {
        bad_capture_case c{ "queries-wrong-heads", {}, { "layers.0.queries" } };
        c.edit.replace["layers.0.queries"] = { { 3, 32, 8 }, f32_zeros(3 * 32 * 8) };
        cases.push_back(c);
    }
    {
        bad_capture_case c{ "full-queries-in-one-layer", {}, { "full_queries" } };
        c.edit.drop.insert("layers.1.full_queries");
        cases.push_back(c);
    }
    {
        bad_capture_case c{ "heads-not-multiple", {}, { "n_heads 3", "n_kv_heads 2" } };
        c.edit.metadata["n_heads"] = "3";
        cases.push_back(c);
    }
    {
        std::vector<std::byte> m(40, std::byte{ 0 });
        m[17] = std::byte{ 3 };
        bad_capture_case c{ "modality-3", {}, { "modality", "3" } };
        c.edit.replace["modality"] = { { 40 }, m };
        cases.push_back(c);
    }
    {
        bad_capture_case c{ "modality-short", {}, { "modality", "39", "40" } };
        c.edit.replace["modality"] = { { 39 }, std::vector<std::byte>(39, std::byte{ 0 }) };
        cases.push_back(c);
    }
    temp_dir dir;
    for (const bad_capture_case & c : cases) {
        SCOPED_TRACE(c.name);
        const std::string path = dir / (std::string(c.name) + ".safetensors");
        write_raw_capture(path, cap.view(), c.edit);
        std::vector<std::string> parts = c.message;
        parts.push_back(path);
        try {
            (void) ecokv::capture_file::open(path);
            ADD_FAILURE() << "no error";
        } catch (const ecokv::error & e) {
            const std::string msg = e.what();
            for (const std::string & p : parts) {
                EXPECT_NE(msg.find(p), std::string::npos) << "message \"" << msg << "\" lacks \"" << p << "\"";
            }
        }
    }
}

TEST(capture, raw_writer_without_edits_is_a_valid_capture) {
    // The helper of the previous test writes a good capture when asked for no change (so its failures are real).
    const ecokv::owned_capture cap = ecokv::make_synth_capture(small_params());
    temp_dir                   dir;
    write_raw_capture(dir / "ok.safetensors", cap.view(), {});
    const auto f = ecokv::capture_file::open(dir / "ok.safetensors");
    expect_same_view(f.view().layers[1].values, cap.view().layers[1].values, "values");
    EXPECT_EQ(f.view().modality, cap.view().modality);
}

TEST(capture, not_a_safetensors_file) {
    temp_dir dir;
    const std::string path = dir / "text.safetensors";
    write_file(path, "hello, world: this is not a capture\n");
    expect_error([&] { (void) ecokv::capture_file::open(path); }, { path });
    expect_error([&] { (void) ecokv::capture_file::open(dir / "absent.safetensors"); },
                 { dir / "absent.safetensors", "cannot open" });
}

// A copy of a capture whose data a test may patch.
struct patched_capture {
    ecokv::capture_view                 view;
    std::vector<std::vector<std::byte>> buffers;

    explicit patched_capture(const ecokv::capture_view & src) : view(src) {
        buffers.reserve(src.layers.size() * 4);
        for (auto & lc : view.layers) {
            for (ecokv::tensor_view * t : { &lc.keys, &lc.values, &lc.queries, &lc.full_queries }) {
                if (t->empty()) {
                    continue;
                }
                const size_t n = size_t(t->n_elements()) * ecokv::dtype_size(t->type);
                auto &       b = buffers.emplace_back(n);
                std::memcpy(b.data(), t->data, n);  // packed views: one block
                t->data = b.data();
            }
        }
    }
    // Sets element (head, token, i) of a packed F32/F16 view to x.
    static void set(const ecokv::tensor_view & t, int64_t head, int64_t token, int64_t i, float x) {
        char * p = static_cast<char *>(const_cast<void *>(t.data)) + head * t.nb[2] + token * t.nb[1] + i * t.nb[0];
        if (t.type == ecokv::dtype::f32) {
            std::memcpy(p, &x, 4);
        } else {
            const uint16_t h = half_bits(_Float16(x));
            std::memcpy(p, &h, 2);
        }
    }
};

TEST(capture, check_finite_names_the_tensor) {
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    for (ecokv::dtype type : { ecokv::dtype::f32, ecokv::dtype::f16 }) {
        SCOPED_TRACE(std::string(ecokv::dtype_name(type)));
        const ecokv::owned_capture cap = ecokv::make_synth_capture(small_params(type));
        {
            patched_capture pc(cap.view());
            EXPECT_NO_THROW(pc.view.check_finite());
            patched_capture::set(pc.view.layers[0].keys, 1, 39, 7, nan);
            expect_error([&] { pc.view.check_finite(); }, { "layers.0.keys", "NaN" });
        }
        {
            patched_capture pc(cap.view());
            patched_capture::set(pc.view.layers[1].keys, 0, 0, 0, -inf);
            expect_error([&] { pc.view.check_finite(); }, { "layers.1.keys" });
        }
        {
            patched_capture pc(cap.view());
            patched_capture::set(pc.view.layers[1].values, 1, 20, 5, inf);
            expect_error([&] { pc.view.check_finite(); }, { "layers.1.values" });
        }
        {
            patched_capture pc(cap.view());
            patched_capture::set(pc.view.layers[0].queries, 3, 31, 0, nan);
            expect_error([&] { pc.view.check_finite(); }, { "layers.0.queries" });
        }
        {
            patched_capture pc(cap.view());
            patched_capture::set(pc.view.layers[1].full_queries, 2, 3, 4, nan);
            expect_error([&] { pc.view.check_finite(); }, { "layers.1.full_queries" });
        }
    }
}

TEST(capture, compress_refuses_non_finite_data) {
    const ecokv::owned_capture cap = ecokv::make_synth_capture(small_params());
    patched_capture            pc(cap.view());
    patched_capture::set(pc.view.layers[1].keys, 0, 3, 2, std::numeric_limits<float>::quiet_NaN());
    ecokv::method_params params;
    params.budget = 16;
    params.window = 4;
    expect_error([&] { (void) ecokv::compress(pc.view, ecokv::parse_method("snapkv"), params); },
                 { "layers.1.keys" });
    // Also when the budget covers the prompt (nothing to compress, still validated).
    params.budget = 64;
    expect_error([&] { (void) ecokv::compress(pc.view, ecokv::parse_method("snapkv"), params); },
                 { "layers.1.keys" });
}

TEST(capture, write_capture_refuses_an_invalid_view) {
    const ecokv::owned_capture cap = ecokv::make_synth_capture(small_params());
    ecokv::capture_view        v   = cap.view();
    v.n_kv_heads                   = 3;  // 4 heads are not a multiple of 3
    temp_dir          dir;
    const std::string path = dir / "bad.safetensors";
    expect_error([&] { ecokv::write_capture(path, v); }, { "n_kv_heads 3" });
    EXPECT_FALSE(fs::exists(path));
    EXPECT_TRUE(dir.list().empty());
}

// ---------------------------------------------------------------------------------------------------------------
// atomic writes

TEST(write_file_atomic, missing_directory_creates_nothing) {
    temp_dir          dir;
    const std::string target = dir / "no/such/dir/out.json";
    expect_error([&] { ecokv::write_file_atomic(target, "data"); }, { target });
    EXPECT_FALSE(fs::exists(dir / "no"));
    EXPECT_TRUE(dir.list().empty());
    // The writers built on it behave the same.
    ecokv::safetensors_writer w;
    w.add("x", ecokv::dtype::u8, { 1 }, { std::byte{ 1 } });
    expect_error([&] { w.write(target); }, { target });
    EXPECT_TRUE(dir.list().empty());
}

TEST(write_file_atomic, success_leaves_only_the_target) {
    temp_dir          dir;
    const std::string target = dir / "out.bin";
    std::string       payload;
    for (int i = 0; i < 200000; ++i) {
        payload.push_back(char(i * 7));
    }
    ecokv::write_file_atomic(target, payload);
    EXPECT_EQ(read_file(target), payload);
    EXPECT_EQ(dir.list(), (std::set<std::string>{ "out.bin" }));
    // Overwriting replaces the content entirely (shorter content: no stale tail) and leaves no temporary.
    ecokv::write_file_atomic(target, "short");
    EXPECT_EQ(read_file(target), "short");
    ecokv::write_file_atomic(target, "");
    EXPECT_EQ(read_file(target), "");
    EXPECT_TRUE(fs::exists(target));
    EXPECT_EQ(dir.list(), (std::set<std::string>{ "out.bin" }));
    // A path relative to the current directory works too.
    const fs::path old = fs::current_path();
    fs::current_path(dir.path());
    ecokv::write_file_atomic("rel.txt", "relative");
    fs::current_path(old);
    EXPECT_EQ(read_file(dir / "rel.txt"), "relative");
    EXPECT_EQ(dir.list(), (std::set<std::string>{ "out.bin", "rel.txt" }));
}

TEST(write_file_atomic, target_is_a_directory) {
    temp_dir          dir;
    const std::string target = dir / "taken";
    fs::create_directory(target);
    fs::path marker = fs::path(target) / "inside";
    write_file(marker.string(), "keep");
    expect_error([&] { ecokv::write_file_atomic(target, "data"); }, { target });
    EXPECT_TRUE(fs::is_directory(target));
    EXPECT_EQ(read_file(marker.string()), "keep");
    EXPECT_EQ(dir.list(), (std::set<std::string>{ "taken" }));  // no temporary left
}

TEST(write_file_atomic, failure_keeps_the_previous_file) {
    // A failed write leaves the files already in the directory as they were.
    temp_dir          dir;
    const std::string target = dir / "out.json";
    write_file(target, "previous");
    expect_error([&] { ecokv::write_file_atomic(dir / "missing/out.json", "new"); }, { "missing/out.json" });
    EXPECT_EQ(read_file(target), "previous");
    EXPECT_EQ(dir.list(), (std::set<std::string>{ "out.json" }));
}

// ---------------------------------------------------------------------------------------------------------------
// selection output

TEST(selection_json, has_every_spec_key) {
    for (ecokv::dtype type : { ecokv::dtype::f32, ecokv::dtype::f16 }) {
        SCOPED_TRACE(std::string(ecokv::dtype_name(type)));
        const ecokv::owned_capture cap = ecokv::make_synth_capture(small_params(type));
        ecokv::method_params       params;
        params.budget = 12;
        params.window = 4;
        const ecokv::selection sel = ecokv::compress(cap.view(), ecokv::parse_method("snapkv"), params, { 1 });
        temp_dir          dir;
        const std::string path = dir / "sel.json";
        ecokv::write_selection_json(path, sel);
        EXPECT_EQ(dir.list(), (std::set<std::string>{ "sel.json" }));
        const json j = json::parse(read_file(path));
        ASSERT_TRUE(j.is_object());
        for (const char * key : { "method", "budget", "window", "n_tokens", "layers", "kv_bytes_full", "kv_bytes_kept" }) {
            EXPECT_TRUE(j.contains(key)) << key;
        }
        EXPECT_EQ(j["method"], "uniform+snapkv");
        EXPECT_EQ(j["budget"], 12);
        EXPECT_EQ(j["window"], 4);
        EXPECT_EQ(j["n_tokens"], 40);
        // By hand: L 2 * Hkv 2 * T 40 * (D 8 * es + Dv 6 * es).
        const uint64_t es = type == ecokv::dtype::f32 ? 4 : 2;
        EXPECT_EQ(j["kv_bytes_full"].get<uint64_t>(), 2u * 2 * 40 * (8 * es + 6 * es));
        EXPECT_EQ(j["kv_bytes_full"].get<uint64_t>(), type == ecokv::dtype::f32 ? 8960u : 4480u);
        // Uniform: every head keeps B = 12 entries.
        EXPECT_EQ(j["kv_bytes_kept"].get<uint64_t>(), 2u * 2 * 12 * (8 * es + 6 * es));
        ASSERT_TRUE(j["layers"].is_array());
        ASSERT_EQ(j["layers"].size(), 2u);
        for (size_t il = 0; il < 2; ++il) {
            const json & heads = j["layers"][il]["heads"];
            ASSERT_TRUE(heads.is_array());
            ASSERT_EQ(heads.size(), 2u);
            for (size_t ig = 0; ig < 2; ++ig) {
                const auto kept = heads[ig].get<std::vector<int32_t>>();
                EXPECT_EQ(kept, sel.layers[il][ig].kept);
                ASSERT_EQ(kept.size(), 12u);
                EXPECT_TRUE(std::is_sorted(kept.begin(), kept.end()));
                EXPECT_EQ(std::adjacent_find(kept.begin(), kept.end()), kept.end());  // strictly ascending
                EXPECT_GE(kept.front(), 0);
                // The window (last 4 tokens) is always kept.
                EXPECT_EQ(std::vector<int32_t>(kept.end() - 4, kept.end()), (std::vector<int32_t>{ 36, 37, 38, 39 }));
            }
        }
    }
}

TEST(selection_json, budget_covering_the_prompt_keeps_everything) {
    const ecokv::owned_capture cap = ecokv::make_synth_capture(small_params());
    ecokv::method_params       params;
    params.budget = 64;  // > T = 40
    params.window = 8;
    const ecokv::selection sel = ecokv::compress(cap.view(), ecokv::parse_method("pyramidkv+knorm"), params, { 1 });
    temp_dir               dir;
    ecokv::write_selection_json(dir / "sel.json", sel);
    const json j = json::parse(read_file(dir / "sel.json"));
    EXPECT_EQ(j["method"], "pyramidkv+knorm");
    EXPECT_EQ(j["budget"], 64);
    EXPECT_EQ(j["kv_bytes_kept"], j["kv_bytes_full"]);
    std::vector<int32_t> all(40);
    for (int i = 0; i < 40; ++i) {
        all[i] = i;
    }
    for (const json & layer : j["layers"]) {
        for (const json & h : layer["heads"]) {
            EXPECT_EQ(h.get<std::vector<int32_t>>(), all);
        }
    }
}

TEST(selection_json, unwritable_path) {
    const ecokv::owned_capture cap = ecokv::make_synth_capture(small_params());
    ecokv::method_params       params;
    params.budget = 12;
    params.window = 4;
    const ecokv::selection sel = ecokv::compress(cap.view(), ecokv::parse_method("snapkv"), params, { 1 });
    temp_dir          dir;
    const std::string path = dir / "absent/sel.json";
    expect_error([&] { ecokv::write_selection_json(path, sel); }, { path });
    EXPECT_TRUE(dir.list().empty());
}

TEST(merged_rows, one_tensor_per_layer_and_head) {
    const ecokv::owned_capture cap = ecokv::make_synth_capture(small_params());  // has full queries (h2o)
    ecokv::method_params       params;
    params.budget = 14;
    params.window = 4;
    params.merge  = ecokv::merge_kind::pivot;
    const ecokv::selection sel = ecokv::compress(cap.view(), ecokv::parse_method("lookm"), params, { 1 });
    EXPECT_EQ(sel.method, "lookm+h2o");
    temp_dir          dir;
    const std::string path = dir / "merged.safetensors";
    ecokv::write_merged_rows(path, sel);
    EXPECT_EQ(dir.list(), (std::set<std::string>{ "merged.safetensors" }));

    // Parse the file by hand (nlohmann) rather than with our reader.
    const std::string file = read_file(path);
    const uint64_t    nh   = header_length_of(file);
    EXPECT_EQ(nh % 8, 0u);
    const json header = json::parse(file.substr(8, nh));
    EXPECT_EQ(header["__metadata__"]["method"], "lookm+h2o");
    EXPECT_EQ(header.size(), 2u * 2 * 2 + 1);  // keys and values per (layer, head) + metadata
    uint64_t total = 0;
    for (int il = 0; il < 2; ++il) {
        for (int ig = 0; ig < 2; ++ig) {
            const std::string        p    = "layers." + std::to_string(il) + ".heads." + std::to_string(ig) + ".";
            const auto &             hs   = sel.layers[il][ig];
            const int64_t            kept = int64_t(hs.kept.size());
            EXPECT_EQ(kept, 14);  // uniform split of the budget in every head
            ASSERT_TRUE(header.contains(p + "keys")) << p;
            ASSERT_TRUE(header.contains(p + "values")) << p;
            EXPECT_EQ(header[p + "keys"]["dtype"], "F32");
            EXPECT_EQ(header[p + "keys"]["shape"], (json{ kept, 8 }));
            EXPECT_EQ(header[p + "values"]["dtype"], "F32");
            EXPECT_EQ(header[p + "values"]["shape"], (json{ kept, 6 }));
            const uint64_t kb = header[p + "keys"]["data_offsets"][0], ke = header[p + "keys"]["data_offsets"][1];
            const uint64_t vb = header[p + "values"]["data_offsets"][0], ve = header[p + "values"]["data_offsets"][1];
            EXPECT_EQ(ke - kb, uint64_t(kept) * 8 * 4);
            EXPECT_EQ(ve - vb, uint64_t(kept) * 6 * 4);
            EXPECT_EQ(file.substr(8 + nh + kb, ke - kb), raw(hs.keys));
            EXPECT_EQ(file.substr(8 + nh + vb, ve - vb), raw(hs.values));
            total += (ke - kb) + (ve - vb);
            for (float x : hs.keys) {
                EXPECT_TRUE(std::isfinite(x));
            }
        }
    }
    EXPECT_EQ(file.size(), 8 + nh + total);
}

TEST(merged_rows, without_merge_throws_and_writes_nothing) {
    const ecokv::owned_capture cap = ecokv::make_synth_capture(small_params());
    ecokv::method_params       params;
    params.budget = 14;
    params.window = 4;
    const ecokv::selection sel = ecokv::compress(cap.view(), ecokv::parse_method("lookm"), params, { 1 });
    temp_dir          dir;
    const std::string path = dir / "merged.safetensors";
    expect_error([&] { ecokv::write_merged_rows(path, sel); }, { path, "merge" });
    EXPECT_FALSE(fs::exists(path));
    EXPECT_TRUE(dir.list().empty());
}

// ---------------------------------------------------------------------------------------------------------------
// synthetic captures

std::string capture_bytes(const ecokv::capture_view & v) {
    std::string out;
    for (const auto & lc : v.layers) {
        for (const ecokv::tensor_view * t : { &lc.keys, &lc.values, &lc.queries, &lc.full_queries }) {
            if (!t->empty()) {
                out.append(static_cast<const char *>(t->data), size_t(t->n_elements()) * ecokv::dtype_size(t->type));
            }
        }
    }
    return out;
}

TEST(synth, deterministic) {
    for (ecokv::dtype type : { ecokv::dtype::f32, ecokv::dtype::f16 }) {
        const ecokv::synth_params p = small_params(type);
        const auto                a = ecokv::make_synth_capture(p);
        const auto                b = ecokv::make_synth_capture(p);
        const std::string         ba = capture_bytes(a.view()), bb = capture_bytes(b.view());
        // Expected size by hand: per layer Hkv*T*D + Hkv*T*Dv + H*Nq*D + H*T*D elements.
        const size_t es = ecokv::dtype_size(type);
        EXPECT_EQ(ba.size(), 2 * (2 * 40 * 8 + 2 * 40 * 6 + 4 * 32 * 8 + 4 * 40 * 8) * es);
        EXPECT_EQ(ba, bb);
        EXPECT_EQ(a.view().modality, b.view().modality);

        ecokv::synth_params q = p;
        q.seed                = p.seed + 1;
        const auto c          = ecokv::make_synth_capture(q);
        const std::string bc  = capture_bytes(c.view());
        ASSERT_EQ(bc.size(), ba.size());
        EXPECT_NE(bc, ba);
        // Every tensor differs, not just one.
        for (size_t il = 0; il < 2; ++il) {
            EXPECT_NE(elements(c.view().layers[il].keys), elements(a.view().layers[il].keys));
            EXPECT_NE(elements(c.view().layers[il].values), elements(a.view().layers[il].values));
            EXPECT_NE(elements(c.view().layers[il].queries), elements(a.view().layers[il].queries));
        }
    }
}

TEST(synth, files_are_byte_identical) {
    temp_dir dir;
    const ecokv::synth_params p = small_params();
    ecokv::write_capture(dir / "a.safetensors", ecokv::make_synth_capture(p).view());
    ecokv::write_capture(dir / "b.safetensors", ecokv::make_synth_capture(p).view());
    EXPECT_EQ(read_file(dir / "a.safetensors"), read_file(dir / "b.safetensors"));
}

TEST(synth, window_queries_are_the_tail_of_full_queries) {
    // The window queries are those of the last Nq tokens: rows T - Nq .. T - 1 of full_queries.
    const auto   cap = ecokv::make_synth_capture(small_params());
    const auto & v   = cap.view();
    for (const auto & lc : v.layers) {
        for (int64_t h = 0; h < v.n_heads; ++h) {
            for (int64_t r = 0; r < v.n_queries; ++r) {
                EXPECT_EQ(0, std::memcmp(lc.queries.row(r, h), lc.full_queries.row(v.n_tokens - v.n_queries + r, h),
                                         size_t(v.head_dim) * 4));
            }
        }
    }
}

TEST(synth, image_spans_set_modality) {
    ecokv::synth_params p = small_params();
    p.image_spans         = { { 3, 7 }, { 10, 12 }, { 39, 40 } };
    const auto cap        = ecokv::make_synth_capture(p);
    std::vector<uint8_t> expected(40, 0);
    for (int t : { 3, 4, 5, 6, 10, 11, 39 }) {
        expected[size_t(t)] = 1;
    }
    EXPECT_EQ(cap.view().modality, expected);

    p.image_spans = {};
    EXPECT_TRUE(ecokv::make_synth_capture(p).view().modality.empty());
    EXPECT_TRUE(ecokv::make_synth_capture(p).view().is_text(5));
}

TEST(synth, invalid_parameters_name_the_option) {
    ecokv::synth_params p = small_params();
    p.n_heads             = 6;
    p.n_kv_heads          = 4;
    expect_error([&] { (void) ecokv::make_synth_capture(p); }, { "--heads 6", "--kv-heads 4" });
    p            = small_params();
    p.n_queries  = 41;
    expect_error([&] { (void) ecokv::make_synth_capture(p); }, { "--queries 41", "--tokens 40" });
    p             = small_params();
    p.image_spans = { { 30, 41 } };
    expect_error([&] { (void) ecokv::make_synth_capture(p); }, { "--image-tokens 30:41" });
    p          = small_params();
    p.head_dim = 7;
    expect_error([&] { (void) ecokv::make_synth_capture(p); }, { "--head-dim 7" });
}

}  // namespace
