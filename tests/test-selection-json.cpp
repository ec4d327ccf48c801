// The selection JSON and the merged rows of LOOK-M (SPEC §8).
//
// Expected values are computed independently of the code under test: nlohmann::json for parsing what we write,
// arithmetic by hand.
#include "ecokv/ecokv.h"

#include "test-io-util.h"
#include "test-util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

namespace {

using namespace ecokv::test;
using json = nlohmann::json;

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

}  // namespace
