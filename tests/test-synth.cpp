// Synthetic captures: determinism, byte-identical files, window queries, image spans, parameter errors.
#include "ecokv/ecokv.h"

#include "test-io-util.h"
#include "test-util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace ecokv::test;

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
