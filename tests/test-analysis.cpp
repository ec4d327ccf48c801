// The ECOKV paper's analyses (ecokv/analysis.h) against values worked out by hand or by plain loops here.
#include "ecokv/analysis.h"
#include "ecokv/error.h"
#include "test-capture-util.h"
#include "test-util.h"

#include <gtest/gtest.h>

#include <cmath>

namespace {

using ecokv::test::error_of;
using ecokv::test::make_capture;

TEST(analysis, spearman_by_hand) {
    EXPECT_DOUBLE_EQ(ecokv::spearman({ 1, 2, 3, 4 }, { 10, 20, 30, 90 }), 1.0);
    EXPECT_DOUBLE_EQ(ecokv::spearman({ 1, 2, 3, 4 }, { 4, 3, 2, 1 }), -1.0);
    // Ties share their mean rank: x ranks (1, 2.5, 2.5, 4), y ranks (1, 3, 2, 4); sum dx dy = 4.5, sum dx^2 = 4.5,
    // sum dy^2 = 5.
    EXPECT_NEAR(ecokv::spearman({ 1, 2, 2, 3 }, { 1, 3, 2, 4 }), 4.5 / std::sqrt(4.5 * 5.0), 1e-12);
    EXPECT_EQ(ecokv::spearman({ 5, 5, 5 }, { 1, 2, 3 }), 0.0);
    EXPECT_NE(error_of([] { ecokv::spearman({ 1, 2 }, { 1, 2, 3 }); }), "");
}

// Eight 2-D keys at known angles: k1 repeats k0's direction, k3 repeats k2's.
const std::vector<float> k_keys = { 1, 0, 2, 0, 0, 1, 0, 3, -1, 0, 1, 1, 0, -1, -1, 1 };

std::vector<double> unit(int32_t i) {
    const double x = k_keys[2 * i], y = k_keys[2 * i + 1], n = std::hypot(x, y);
    return { x / n, y / n };
}

TEST(analysis, pairwise_key_geometry_by_hand) {
    const int32_t            t = 8, d = 2;
    const std::vector<float> values(k_keys.size(), 1.0f), queries = { 1, 0, 0, 1 };
    const ecokv::capture_view cap = make_capture(1, 1, d, t, 2, k_keys, values, queries);
    ecokv::method_params      p;
    p.budget = 6, p.window = 2, p.beta = 0.6;
    ecokv::analysis_options o;
    o.n_bins = 4;
    const ecokv::capture_analysis a = ecokv::analyze(cap, ecokv::parse_method("snapkv"), p, o);
    ASSERT_EQ(a.heads.size(), 1u);
    const ecokv::head_analysis & h = a.heads[0];

    // The pairs written out: mean cosine and a 4-bin histogram over [-1, 1].
    std::vector<double> hist(4, 0.0);
    double              sum = 0;
    for (int32_t i = 0; i < t; ++i) {
        for (int32_t j = i + 1; j < t; ++j) {
            const double c = unit(i)[0] * unit(j)[0] + unit(i)[1] * unit(j)[1];
            sum += c;
            hist[c < -0.5 ? 0 : c < 0 ? 1 : c < 0.5 ? 2 : 3] += 1.0 / 28;
        }
    }
    EXPECT_EQ(h.n_pair_keys, 8);
    EXPECT_NEAR(h.pair_cos_mean, sum / 28, 1e-12);
    for (size_t b = 0; b < 4; ++b) {
        EXPECT_NEAR(h.cos_hist[b], hist[b], 1e-12) << "bin " << b;
    }
    EXPECT_DOUBLE_EQ(h.near_duplicates, 0.5);  // k0, k1, k2, k3
    // rC, the kernel's (n |mu|^2 - 1) / (n - 1), is the same mean over distinct pairs.
    EXPECT_NEAR(h.r_c, sum / 28, 1e-6);
    // DE: mean distance to the mean key; rE = 2 - 2 sigmoid(DE / sqrt(2)); lambda = 0.6 rE + 0.4 rC.
    double kx = 0, ky = 0, de = 0;
    for (int32_t i = 0; i < t; ++i) {
        kx += k_keys[2 * i] / 8.0, ky += k_keys[2 * i + 1] / 8.0;
    }
    for (int32_t i = 0; i < t; ++i) {
        de += std::hypot(k_keys[2 * i] - kx, k_keys[2 * i + 1] - ky) / 8.0;
    }
    const double re = 2 - 2 / (1 + std::exp(-de / std::sqrt(2.0)));
    EXPECT_NEAR(h.mean_dist, de, 1e-6);
    EXPECT_NEAR(h.r_e, re, 1e-6);
    EXPECT_NEAR(h.lambda, 0.6 * re + 0.4 * (sum / 28), 1e-6);
    EXPECT_GE(h.spearman, -1.0);
    EXPECT_LE(h.spearman, 1.0);

    // Four evenly spaced keys (k0, k2, k4, k6: a right angle apart) give cosines 0, -1, 0, 0, -1, 0.
    o.max_pair_keys                  = 4;
    const ecokv::head_analysis four = ecokv::analyze(cap, ecokv::parse_method("snapkv"), p, o).heads[0];
    EXPECT_EQ(four.n_pair_keys, 4);
    EXPECT_NEAR(four.pair_cos_mean, -1.0 / 3, 1e-12);
    EXPECT_DOUBLE_EQ(four.near_duplicates, 0.0);
    EXPECT_NEAR(four.cos_hist[0], 2.0 / 6, 1e-12);  // -1
    EXPECT_NEAR(four.cos_hist[2], 4.0 / 6, 1e-12);  // 0
}

// StreamingLLM at budget 12 with 4 sinks keeps tokens 0-3 and 32-39 of 40 in every head: the kept share is 1 there
// and 0 elsewhere, and the last 32 tokens (8-39) are kept from position 24 on.
TEST(analysis, kept_share_and_the_last_tokens_by_hand) {
    const int32_t      t = 40, d = 4;
    std::vector<float> keys(size_t(2 * t * d)), queries(size_t(2 * 2 * d), 0.5f);
    for (size_t i = 0; i < keys.size(); ++i) {
        keys[i] = float((i * 7919) % 13) - 6.0f;
    }
    const ecokv::capture_view cap = make_capture(2, 2, d, t, 2, keys, keys, queries);
    ecokv::method_params      p;
    p.budget = 12, p.window = 2;
    const ecokv::capture_analysis a = ecokv::analyze(cap, ecokv::parse_method("streamingllm"), p);
    ASSERT_EQ(a.kept_share.size(), size_t(t));
    ASSERT_EQ(a.kept_share_by_layer.size(), 1u);  // one layer
    for (int32_t i = 0; i < t; ++i) {
        EXPECT_DOUBLE_EQ(a.kept_share[size_t(i)], i < 4 || i >= 32 ? 1.0 : 0.0) << "token " << i;
        for (const std::vector<double> & layer : a.kept_share_by_layer) {
            EXPECT_DOUBLE_EQ(layer[size_t(i)], i < 4 || i >= 32 ? 1.0 : 0.0) << "token " << i;
        }
    }
    ASSERT_EQ(a.recent_kept.size(), 32u);
    for (int32_t i = 0; i < 32; ++i) {
        EXPECT_DOUBLE_EQ(a.recent_kept[size_t(i)], i >= 24 ? 1.0 : 0.0) << "position " << i;
    }
}

TEST(analysis, bad_input_is_refused) {
    const std::vector<float>  values(k_keys.size(), 1.0f), queries(14, 0.5f);  // 7 window queries
    ecokv::capture_view       cap = make_capture(1, 1, 2, 8, 7, k_keys, values, queries);
    ecokv::method_params      p;
    p.budget = 8, p.window = 7;
    EXPECT_NE(error_of([&] { ecokv::analyze(cap, ecokv::parse_method("snapkv"), p); }).find("at least 9"),
              std::string::npos);
    p.window = 2;
    ecokv::analysis_options o;
    o.n_bins = 0;
    EXPECT_NE(error_of([&] { ecokv::analyze(cap, ecokv::parse_method("snapkv"), p, o); }), "");
    EXPECT_NE(error_of([&] { ecokv::analyze(cap, ecokv::parse_method("nosuch"), p); }), "");
    // A method that reads no queries, with a window larger than the queries captured.
    const std::vector<float> two_queries(4, 0.5f);
    const ecokv::capture_view short_cap = make_capture(1, 1, 2, 8, 2, k_keys, values, two_queries);
    p.window                            = 5;
    EXPECT_NE(error_of([&] { ecokv::analyze(short_cap, ecokv::parse_method("manifoldkv"), p); }).find("holds 2"),
              std::string::npos);
}

}  // namespace
