// Golden selections from the independent numpy reference (scripts/reference/, fp64): every case of
// tests/data/golden/cases.json must select exactly the same tokens, with scores and merged rows within
// fp32 tolerance.
#include "ecokv/ecokv.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

namespace {

using json = nlohmann::json;

const std::string k_dir = std::string(ECOKV_TEST_DATA) + "/golden/";

const json & cases() {
    static const json all = [] {
        std::ifstream in(k_dir + "cases.json");
        return json::parse(in);
    }();
    return all;
}

ecokv::method_params params_of(const json & p) {
    ecokv::method_params out;
    out.budget = p.at("budget").get<int32_t>();
    out.window = p.value("window", -1);
    out.kernel = p.value("kernel", 5);
    out.pool   = p.value("pool", std::string("avg")) == "max" ? ecokv::pool_kind::max : ecokv::pool_kind::avg;
    out.alpha  = p.value("alpha", 0.8);
    out.beta   = p.value("beta", 0.6);
    if (p.contains("head_scores")) {
        out.head_scores = k_dir + p["head_scores"].get<std::string>();
    }
    if (p.value("merge", std::string("none")) == "pivot") {
        out.merge = ecokv::merge_kind::pivot;
    }
    return out;
}

class golden : public ::testing::TestWithParam<size_t> {};

TEST_P(golden, matches_reference) {
    const json & c        = cases()[GetParam()];
    const json & expected = c["expected"];
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto                 cap    = ecokv::capture_file::open(k_dir + c["capture"].get<std::string>());
    const ecokv::method_spec   spec   = ecokv::parse_method(c["method"].get<std::string>());
    const ecokv::method_params params = params_of(c["params"]);

    for (int32_t threads : { 1, 2 }) {
        const ecokv::selection sel = ecokv::compress(cap.view(), spec, params, { threads });
        ASSERT_EQ(sel.layers.size(), expected["heads"].size());
        for (size_t il = 0; il < sel.layers.size(); ++il) {
            for (size_t ig = 0; ig < sel.layers[il].size(); ++ig) {
                EXPECT_EQ(sel.layers[il][ig].kept, expected["heads"][il][ig].get<std::vector<int32_t>>())
                    << "layer " << il << " head " << ig << " threads " << threads;
            }
        }
        EXPECT_EQ(sel.kv_bytes_full, expected["kv_bytes_full"].get<uint64_t>());
        EXPECT_EQ(sel.kv_bytes_kept, expected["kv_bytes_kept"].get<uint64_t>());
        if (spec.scorer != "streamingllm") {  // the reference reports StreamingLLM's window as B - 4
            EXPECT_EQ(sel.window, expected["window"].get<int32_t>());
        }
        if (expected.contains("merged_keys")) {
            for (size_t il = 0; il < sel.layers.size(); ++il) {
                for (size_t ig = 0; ig < sel.layers[il].size(); ++ig) {
                    const auto & h = sel.layers[il][ig];
                    const auto & rk = expected["merged_keys"][il][ig];
                    const auto & rv = expected["merged_values"][il][ig];
                    ASSERT_EQ(h.kept.size(), rk.size());
                    const size_t d = h.keys.size() / h.kept.size(), dv = h.values.size() / h.kept.size();
                    for (size_t r = 0; r < rk.size(); ++r) {
                        for (size_t i = 0; i < d; ++i) {
                            EXPECT_NEAR(h.keys[r * d + i], rk[r][i].get<double>(), 1e-4 + 1e-5 * std::fabs(rk[r][i].get<double>()));
                        }
                        for (size_t i = 0; i < dv; ++i) {
                            EXPECT_NEAR(h.values[r * dv + i], rv[r][i].get<double>(), 1e-4 + 1e-5 * std::fabs(rv[r][i].get<double>()));
                        }
                    }
                }
            }
        }
    }
    if (expected.contains("scores") && params.budget < cap.view().n_tokens) {
        const auto scores = ecokv::score_heads(cap.view(), spec, params, { 1 });
        const int32_t n_kv = cap.view().n_kv_heads;
        for (size_t i = 0; i < scores.size(); ++i) {
            const auto ref = expected["scores"][i / n_kv][i % n_kv].get<std::vector<double>>();
            ASSERT_EQ(scores[i].size(), ref.size());
            const auto [lo, hi] = std::minmax_element(ref.begin(), ref.end());
            const double tol    = 1e-5 * std::max({ std::fabs(*lo), std::fabs(*hi), 1e-12 });
            for (size_t j = 0; j < ref.size(); ++j) {
                EXPECT_NEAR(scores[i][j], ref[j], tol) << "layer " << i / n_kv << " head " << i % n_kv << " token " << j;
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(cases, golden, ::testing::Range<size_t>(0, cases().size()),
                         [](const ::testing::TestParamInfo<size_t> & info) {
                             std::string name = cases()[info.param]["name"].get<std::string>();
                             std::replace_if(name.begin(), name.end(), [](char ch) { return !std::isalnum(ch); }, '_');
                             return name;
                         });

}  // namespace
