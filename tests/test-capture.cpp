// Capture files (SPEC §7): round trips, the golden capture, bad captures named by file and tensor, non-finite
// data.
//
// Expected values are computed independently of the code under test: bad captures written tensor by tensor with
// the raw safetensors writer, elements decoded by half_value.
#include "ecokv/ecokv.h"

#include "test-capture-util.h"
#include "test-io-util.h"
#include "test-util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace ecokv::test;

// ---------------------------------------------------------------------------------------------------------------
// helpers

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
            const uint16_t h = half_bits((x));
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

// An engine's encoded K/V rows (tests/test-capture-util.h's codec): validated as whole blocks, checked for NaN row
// by row, written decoded as F32; queries may not be encoded.
ecokv::synth_params whole_blocks() {  // head dims of whole 16-element blocks
    ecokv::synth_params p = small_params();
    p.head_dim = p.head_dim_v = 2 * k_block;
    return p;
}

struct encoded_capture {
    ecokv::owned_capture        cap = ecokv::make_synth_capture(whole_blocks());
    std::vector<encoded_tensor> store;
    ecokv::capture_view         view = cap.view();

    encoded_capture() {
        store.reserve(size_t(view.n_layers) * 2);
        for (auto & l : view.layers) {
            l.keys   = encoded_view(store.emplace_back(encode(l.keys)), l.keys);
            l.values = encoded_view(store.emplace_back(encode(l.values)), l.values);
        }
    }
};

TEST(capture, encoded_rows_are_validated_decoded_and_written_as_f32) {
    encoded_capture e;
    EXPECT_NO_THROW(e.view.validate());
    EXPECT_NO_THROW(e.view.check_finite());
    EXPECT_EQ(e.view.layers[0].keys.row_bytes(), k_block_bytes * size_t(e.view.head_dim / k_block));
    temp_dir          dir;
    const std::string path = dir / "encoded.safetensors";
    ecokv::write_capture(path, e.view);
    const ecokv::capture_file f = ecokv::capture_file::open(path);
    const ecokv::tensor_view & k = f.view().layers[1].keys;
    ASSERT_EQ(k.type, ecokv::dtype::f32);
    const std::vector<float> & want = e.store[2].decoded;  // layer 1's keys, packed [n_kv][n_tokens][head_dim]
    std::vector<float>         row(size_t(k.ne[0]));
    for (int64_t g = 0; g < k.ne[2]; ++g) {
        for (int64_t t = 0; t < k.ne[1]; ++t) {
            k.row_f32(t, g, row.data());
            for (int64_t i = 0; i < k.ne[0]; ++i) {
                ASSERT_EQ(row[i], want[size_t((g * k.ne[1] + t) * k.ne[0] + i)]) << g << "," << t << "," << i;
            }
        }
    }
}

TEST(capture, bad_encoded_rows_are_refused) {
    {
        encoded_capture e;
        e.view.layers[0].queries = encoded_view(e.store[0], e.view.layers[0].queries);
        expect_error([&] { e.view.validate(); }, { "layers.0.queries", "encoded" });
    }
    {
        encoded_capture e;
        e.view.layers[1].values.codec = nullptr;
        expect_error([&] { e.view.validate(); }, { "layers.1.values", "blocks" });
    }
    {
        encoded_capture    e;  // a block longer than the rows
        ecokv::row_codec   wide = k_codec;
        wide.block_size         = 2 * e.view.head_dim;
        e.view.layers[0].keys.codec = &wide;
        expect_error([&] { e.view.validate(); }, { "layers.0.keys", "test8 blocks" });
    }
    {
        encoded_capture e;  // a NaN scale in layer 1, KV head 1, token 5
        const float     nan = std::numeric_limits<float>::quiet_NaN();
        auto &          kb  = e.store[3].blocks;
        std::memcpy(kb.data() + (size_t(e.view.n_tokens) + 5) * e.view.layers[1].values.row_bytes(), &nan, sizeof nan);
        expect_error([&] { e.view.check_finite(); }, { "layers.1.values", "NaN" });
    }
}

}  // namespace
