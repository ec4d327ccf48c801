// Each SPEC formula on a tiny case whose answer is worked out by hand (or by a plain loop in the test).
#include "ecokv/ecokv.h"
#include "kernels/kernels.h"
#include "method-impl.h"
#include "select.h"
#include "test-capture-util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <unistd.h>

namespace {

using ecokv::capture_view;
using ecokv::tensor_view;

using ecokv::test::make_capture;

TEST(window_attention, causal_mask_and_group_mean_by_hand) {
    // Keys k0=(1,0) k1=(0,1) k2=(0,0) k3=(1,1); window N=2 (tokens 2, 3), D=2 so logits are q.k/sqrt(2).
    const float s2 = std::sqrt(2.0f);
    const std::vector<float> keys = { 1, 0, 0, 1, 0, 0, 1, 1 };
    // Head 0: query at token 2 gives logits (ln3, 0, 0) -> (3,1,1)/5; at token 3 (0, ln3, 0, ln3) -> (1,3,1,3)/8.
    // Head 1: zero queries -> uniform over the visible keys: 1/3 at token 2, 1/4 at token 3.
    const std::vector<float> queries = { s2 * std::log(3.0f), 0, 0, s2 * std::log(3.0f), 0, 0, 0, 0 };
    const capture_view cap = make_capture(2, 1, 2, 4, 2, keys, keys, queries);
    std::vector<float> a0(2);
    ecokv::kernels::window_attention(cap, 0, 0, 2, a0);
    const double head0_0 = (3.0 / 5 + 1.0 / 8) / 2, head0_1 = (1.0 / 5 + 3.0 / 8) / 2;
    const double head1   = (1.0 / 3 + 1.0 / 4) / 2;
    EXPECT_NEAR(a0[0], (head0_0 + head1) / 2, 1e-6);
    EXPECT_NEAR(a0[1], (head0_1 + head1) / 2, 1e-6);
}

TEST(pooling, zero_padded_average_and_max_by_hand) {
    const std::vector<float> x = { 1, 2, 3, 4 };
    const auto avg3 = ecokv::kernels::pool(x, 3, ecokv::pool_kind::avg);
    const auto avg5 = ecokv::kernels::pool(x, 5, ecokv::pool_kind::avg);
    const auto max3 = ecokv::kernels::pool(x, 3, ecokv::pool_kind::max);
    const std::vector<double> want3 = { 1, 2, 3, 7.0 / 3 }, want5 = { 1.2, 2, 2, 1.8 }, wantm = { 2, 3, 4, 4 };
    for (size_t j = 0; j < x.size(); ++j) {
        EXPECT_NEAR(avg3[j], want3[j], 1e-12);
        EXPECT_NEAR(avg5[j], want5[j], 1e-12);
        EXPECT_EQ(max3[j], wantm[j]);
    }
}

TEST(normalisation, minmax_minmax0_rescale_by_hand) {
    const std::vector<double> x  = { 1, 3, 2 };
    const auto                mm = ecokv::kernels::minmax(x);
    EXPECT_DOUBLE_EQ(mm[0], 0.0);
    EXPECT_DOUBLE_EQ(mm[1], 2.0 / (2.0 + 1e-8));
    EXPECT_DOUBLE_EQ(mm[2], 1.0 / (2.0 + 1e-8));
    EXPECT_EQ(ecokv::kernels::minmax0(std::vector<double>{ 5, 5, 5 }), (std::vector<double>{ 0, 0, 0 }));
    EXPECT_EQ(ecokv::kernels::minmax0(x), (std::vector<double>{ 0, 1, 0.5 }));
    std::vector<double> r = { 1, 3 };
    ecokv::kernels::rescale(r, std::vector<double>{ 2, 6 });  // mean 2 -> mean 4
    EXPECT_DOUBLE_EQ(r[0], 1 * 4 / (2 + 1e-8));
    EXPECT_DOUBLE_EQ(r[1], 3 * 4 / (2 + 1e-8));
    EXPECT_EQ(ecokv::kernels::rint_even(2.5), 2.0);
    EXPECT_EQ(ecokv::kernels::rint_even(3.5), 4.0);
    EXPECT_EQ(ecokv::kernels::rint_even(-0.5), -0.0);
}

// Plain loops over a small random head: the quantities of SPEC §4.
struct brute_geometry {
    std::vector<double> c, de;
    double              rc = 0, mean_de = 0;
};

brute_geometry brute(const std::vector<float> & k, int32_t t, int32_t d, int32_t n_prefix) {
    brute_geometry g;
    auto row = [&](int32_t i) { return std::vector<double>(k.begin() + i * d, k.begin() + (i + 1) * d); };
    auto dot = [](const std::vector<double> & a, const std::vector<double> & b) {
        return std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
    };
    double pair_sum = 0;
    for (int32_t i = 0; i < t; ++i) {
        for (int32_t j = 0; j < t; ++j) {
            if (i != j) {
                pair_sum += dot(row(i), row(j)) / std::sqrt(dot(row(i), row(i)) * dot(row(j), row(j)));
            }
        }
    }
    g.rc = pair_sum / (double(t) * (t - 1));
    std::vector<double> mu(static_cast<size_t>(d), 0.0), kbar(static_cast<size_t>(d), 0.0);
    for (int32_t i = 0; i < t; ++i) {
        const auto   r = row(i);
        const double n = std::sqrt(dot(r, r));
        for (int32_t x = 0; x < d; ++x) {
            mu[x] += r[x] / n / t;
            kbar[x] += r[x] / t;
        }
    }
    for (int32_t i = 0; i < t; ++i) {
        auto         r    = row(i);
        const double n    = std::sqrt(dot(r, r));
        double       dist = 0;
        for (int32_t x = 0; x < d; ++x) {
            dist += (r[x] - kbar[x]) * (r[x] - kbar[x]);
        }
        g.mean_de += std::sqrt(dist) / t;
        if (i < n_prefix) {
            g.c.push_back(dot(r, mu) / n);
            g.de.push_back(std::sqrt(dist));
        }
    }
    return g;
}

std::vector<float> random_keys(int32_t n, uint32_t seed) {
    std::vector<float> k(static_cast<size_t>(n));
    uint32_t           s = seed;
    for (float & x : k) {
        s = s * 1664525u + 1013904223u;
        x = float(int32_t(s >> 8) % 2001 - 1000) / 250.0f + 0.7f;  // biased: keys share a direction
    }
    return k;
}

TEST(key_geometry, matches_brute_force_pairwise_cosine_and_distances) {
    const int32_t      t = 9, d = 5, n_prefix = 7;
    const auto         keys = random_keys(t * d, 7);
    const tensor_view  view = tensor_view::packed(keys.data(), ecokv::dtype::f32, { 1, t, d });
    const auto         g    = ecokv::kernels::compute_key_geometry(view, 0, t, n_prefix);
    const brute_geometry b  = brute(keys, t, d, n_prefix);
    // The kernel works in fp32 SIMD with fp64 carries: fp32 tolerances.
    EXPECT_NEAR(g.rc, b.rc, 1e-6);
    EXPECT_NEAR(g.mean_dist, b.mean_de, 1e-6 * b.mean_de);
    for (int32_t j = 0; j < n_prefix; ++j) {
        EXPECT_NEAR(g.cos_mu[j], b.c[j], 1e-6);
        EXPECT_NEAR(g.dist[j], b.de[j], 1e-6 * b.mean_de);
    }
}

double mean_of(const std::vector<double> & x) { return std::accumulate(x.begin(), x.end(), 0.0) / double(x.size()); }

// (x - min) / (max - min + eps).
std::vector<double> written_minmax(const std::vector<double> & x, double eps) {
    const double        lo = *std::min_element(x.begin(), x.end()), hi = *std::max_element(x.begin(), x.end());
    std::vector<double> out;
    for (double v : x) {
        out.push_back((v - lo) / (hi - lo + eps));
    }
    return out;
}

// One head written out for the ECOKV and MixKV checks: window attention a (kernel 1), S_imp = a + sV with
// sV = minmax0(||v||) rescaled to mean(a), and the brute-force key geometry.
struct written_head {
    int32_t              t = 10, d = 4, h = 2, n = 4, n_prefix = 6;
    std::vector<float>   keys = random_keys(t * d, 11), values = random_keys(t * d, 12),
                       queries = random_keys(h * n * d, 13);
    capture_view         cap = make_capture(h, 1, d, t, n, keys, values, queries);
    std::vector<double>  a, simp;
    brute_geometry       g = brute(keys, t, d, n_prefix);

    written_head() {
        std::vector<float> a0f(static_cast<size_t>(n_prefix));
        ecokv::kernels::window_attention(cap, 0, 0, n, a0f);  // checked by hand above
        a.assign(a0f.begin(), a0f.end());
        std::vector<double> vn;
        for (int32_t j = 0; j < n_prefix; ++j) {
            double s = 0;
            for (int32_t x = 0; x < d; ++x) {
                s += double(values[j * d + x]) * values[j * d + x];
            }
            vn.push_back(std::sqrt(s));
        }
        const std::vector<double> sv = written_minmax(vn, 0.0);
        const double              fv = mean_of(a) / (mean_of(sv) + 1e-8);
        for (int32_t j = 0; j < n_prefix; ++j) {
            simp.push_back(a[j] + sv[j] * fv);
        }
    }
};

// ECOKV Algorithm 1 and Eqs. 1-7, written out step by step against score_heads(), under both readings of SPEC §5.2:
// alpha and beta weight the Euclidean terms (Eq. 3/6), or the cosine ones (Figure 3's text). Kernel 1 keeps pooling
// out.
TEST(ecokv, algorithm_1_step_by_step) {
    const written_head w;
    for (const auto reading : { ecokv::ecokv_weights_kind::equations, ecokv::ecokv_weights_kind::figure3 }) {
        ecokv::method_params p;
        p.budget = 7, p.kernel = 1, p.alpha = 0.7, p.beta = 0.4, p.ecokv_weights = reading;
        const auto   got = ecokv::score_heads(w.cap, ecokv::parse_method("ecokv"), p, { 1 })[0];
        const bool   eq  = reading == ecokv::ecokv_weights_kind::equations;
        const double w_e = eq ? p.alpha : 1 - p.alpha, w_re = eq ? p.beta : 1 - p.beta;  // the Euclidean weights
        // Steps 2-9.
        const std::vector<double> se = written_minmax(w.g.de, 1e-8);
        std::vector<double>       sdiv;
        for (int32_t j = 0; j < w.n_prefix; ++j) {
            sdiv.push_back(w_e * se[j] + (1 - w_e) * (1 - w.g.c[j]) / 2);
        }
        const double re     = 2 - 2 / (1 + std::exp(-w.g.mean_de / std::sqrt(double(w.d))));
        const double lambda = w_re * re + (1 - w_re) * w.g.rc;
        const std::vector<double> sdiv_mm = written_minmax(sdiv, 1e-8);
        const double              fd      = mean_of(w.simp) / (mean_of(sdiv_mm) + 1e-8);
        ASSERT_EQ(got.size(), size_t(w.n_prefix));
        for (int32_t j = 0; j < w.n_prefix; ++j) {
            EXPECT_NEAR(got[j], lambda * sdiv_mm[j] * fd + (1 - lambda) * w.simp[j], 1e-5 * mean_of(w.simp))
                << "token " << j << (eq ? " (equations)" : " (figure3)");
        }
    }
}

// MixKV (SPEC §4-§5) written out under both readings of its diversity scale (SPEC §5.2): sC = minmax(-c) matched to
// mean window attention (the official code) or to mean S_imp (ECOKV's App. A.1), S = rC sC + (1 - rC) S_imp.
TEST(mixkv, scores_step_by_step_under_both_scales) {
    const written_head w;
    for (const auto scale : { ecokv::mixkv_scale_kind::attention, ecokv::mixkv_scale_kind::importance }) {
        ecokv::method_params p;
        p.budget = 7, p.kernel = 1, p.window = w.n, p.mixkv_scale = scale;
        const auto          got = ecokv::score_heads(w.cap, ecokv::parse_method("mixkv"), p, { 1 })[0];
        std::vector<double> neg_c;
        for (double c : w.g.c) {
            neg_c.push_back(-c);
        }
        const std::vector<double> sc     = written_minmax(neg_c, 1e-8);
        const double              target = scale == ecokv::mixkv_scale_kind::attention ? mean_of(w.a) : mean_of(w.simp);
        const double              f      = target / (mean_of(sc) + 1e-8);
        ASSERT_EQ(got.size(), size_t(w.n_prefix));
        for (int32_t j = 0; j < w.n_prefix; ++j) {
            EXPECT_NEAR(got[j], w.g.rc * sc[j] * f + (1 - w.g.rc) * w.simp[j], 1e-5 * mean_of(w.simp)) << "token " << j;
        }
    }
}

// Allocators see only dimensions and statistics: a capture without data is enough.
capture_view shape_only(int32_t n_layers, int32_t n_heads, int32_t n_kv_heads, int32_t t) {
    capture_view c;
    c.n_layers = n_layers, c.n_heads = n_heads, c.n_kv_heads = n_kv_heads, c.head_dim = 8, c.head_dim_v = 8;
    c.n_tokens = t, c.n_queries = 32;
    c.layers.resize(size_t(n_layers));
    return c;
}

ecokv::allocation allocate(const char * name, const capture_view & cap, const ecokv::method_params & p,
                           int32_t n_window, const std::vector<ecokv::head_stats> & stats = {}) {
    return ecokv::find_allocator(name).make()->allocate({ cap, p, n_window, stats });
}

TEST(pyramidkv, paper_example_b128_n8_l32) {
    ecokv::method_params p;
    p.budget       = 128;
    const auto out = allocate("pyramidkv", shape_only(32, 8, 4, 4000), p, 8);
    ASSERT_EQ(out.budget.size(), 32u * 4);
    EXPECT_EQ(out.budget[0], 234);
    EXPECT_EQ(out.budget[31 * 4], 17);
    for (int32_t l = 0; l < 32; ++l) {
        for (int32_t g = 0; g < 4; ++g) {
            EXPECT_EQ(out.budget[l * 4 + g], 234 - 7 * l);  // lo = 120/20 = 6, hi = 234, step = 228/31 = 7
        }
    }
}

TEST(pyramidkv, top_capped_at_prefix) {
    ecokv::method_params p;
    p.budget = 40;  // C = 32, hi = 64 - 1 = 63 >= |P| = 50 -> hi = 50, lo = 14, step = 36/3 = 12
    const auto out = allocate("pyramidkv", shape_only(4, 2, 1, 58), p, 8);
    EXPECT_EQ(out.budget, (std::vector<int32_t>{ 50, 38, 26, 14 }));
}

TEST(adakv, counts_and_half_even_rounding_by_hand) {
    // Kernel 1: pooling is the identity. C = 2 (B = N + 2), |P| = 4.
    std::vector<ecokv::head_stats> stats(2);
    stats[0].attn_raw = { 0.1f, 0.4f, 0.2f, 0.3f };  // sorted .4 .3 .2 .1, top-2 share .7 -> .28 .21 .14 .07
    stats[1].attn_raw = { 0.1f, 0.1f, 0.7f, 0.1f };  // sorted .7 .1 .1 .1, top-2 share .8 -> .56 .08 .08 .08
    ecokv::method_params p;
    p.kernel = 1, p.budget = 3;
    // Global top 4: .56 (h1), .28 .21 .14 (h0): cnt = (3, 1). floor(2 * 0.2) = 0: round(2.4) = 2, round(0.8) = 1.
    EXPECT_EQ(allocate("adakv", shape_only(1, 2, 2, 5), p, 1, stats).budget, (std::vector<int32_t>{ 2, 1 }));
    // Floor ratio 0.5: floor(1) = 1; round(3 * .5 + 1) = round(2.5) = 2 and round(1.5) = 2 (half to even).
    p.floor_ratio = 0.5;
    EXPECT_EQ(allocate("adakv", shape_only(1, 2, 2, 5), p, 1, stats).budget, (std::vector<int32_t>{ 2, 2 }));
}

TEST(sparsemm, budgets_from_a_small_head_score_file) {
    const auto path = std::filesystem::temp_directory_path() /
                      ("ecokv-test-head-scores-" + std::to_string(::getpid()) + ".json");
    std::ofstream(path) << R"({"0-0": [1, 3], "0-1": [2], "0-2": [0], "0-3": [4],
                              "1-0": [1], "1-1": [1], "1-2": [1], "1-3": [4], "9-9": [100]})";
    ecokv::method_params p;
    p.budget      = 28;  // N = 8: C = 20, m = floor(2) = 2, pool = 18 * 2 layers * 2 KV heads = 72
    p.head_scores = path.string();
    // Means 2 2 0 4 | 1 1 1 4, total 15; groups of 2 query heads: 4/15 4/15 | 2/15 5/15.
    // round(4/15 * 72 + 2) = round(21.2) = 21; round(2/15 * 72 + 2) = 12 (11.6); round(5/15 * 72 + 2) = 26.
    EXPECT_EQ(allocate("sparsemm", shape_only(2, 4, 2, 100), p, 8).budget, (std::vector<int32_t>{ 21, 21, 12, 26 }));
    std::filesystem::remove(path);
}

TEST(madakv, demand_compensation_and_split_by_hand) {
    capture_view cap = shape_only(1, 2, 2, 6);
    cap.modality     = { 1, 1, 1, 0, 0, 0 };  // P = tokens 0..4 with N = 1: three image, two text
    std::vector<ecokv::head_stats> stats(2);
    // Head 0: image (.5 .25 .25) needs 3 tokens for 0.9 of its mass, text (.5 .5) needs 2: demand 5.
    stats[0].attn_raw = { 0.5f, 0.25f, 0.25f, 0.5f, 0.5f };
    // Head 1: image (.875 .0625 .0625) needs 2, no text mass: demand 2.
    stats[1].attn_raw = { 0.875f, 0.0625f, 0.0625f, 0.0f, 0.0f };
    ecokv::method_params p;
    p.budget       = 4;  // C = 3, m = floor(0.6) = 0, pool = 2 * 3 = 6
    const auto out = allocate("madakv", cap, p, 1, stats);
    EXPECT_EQ(out.budget, (std::vector<int32_t>{ 4, 2 }));       // rint(30/7 = 4.29), rint(12/7 = 1.71)
    EXPECT_EQ(out.budget_image, (std::vector<int32_t>{ 2, 2 }));  // rint(4 * 1/2), rint(2 * 1/1)
}

TEST(selection, ties_go_to_the_lower_index_and_window_is_kept) {
    const capture_view         cap = shape_only(1, 1, 1, 8);
    const std::vector<double>  s   = { 1, 2, 2, 1, 2 };  // P = 0..4, window 5..7
    const auto kept = ecokv::select_head(s, { 2 }, cap.head(0, 0));
    EXPECT_EQ(kept, (std::vector<int32_t>{ 1, 2, 5, 6, 7 }));
}

TEST(selection, text_first_and_modality_split_with_overflow) {
    capture_view cap = shape_only(1, 1, 1, 7);
    cap.modality     = { 1, 0, 1, 1, 0, 0, 0 };  // P = 0..4: image 0 2 3, text 1 4; window 5 6
    const std::vector<double> s = { 9, 1, 8, 7, 2 };
    EXPECT_EQ(ecokv::select_head(s, { 3, -1, true }, cap.head(0, 0)), (std::vector<int32_t>{ 0, 1, 4, 5, 6 }));
    // Split asks 1 image + 3 text, but only 2 text exist: the spare slot returns to image (0, then 2).
    EXPECT_EQ(ecokv::select_head(s, { 4, 1 }, cap.head(0, 0)), (std::vector<int32_t>{ 0, 1, 2, 4, 5, 6 }));
}

TEST(streamingllm, keeps_sinks_and_the_most_recent_tokens) {
    ecokv::synth_params sp;
    sp.n_layers = 1, sp.n_tokens = 100, sp.head_dim = 8;
    const auto cap = ecokv::make_synth_capture(sp);
    ecokv::method_params p;
    p.budget       = 20;
    const auto sel = ecokv::compress(cap.view(), ecokv::parse_method("streamingllm"), p);
    std::vector<int32_t> want = { 0, 1, 2, 3 };
    for (int32_t t = 84; t < 100; ++t) {
        want.push_back(t);
    }
    for (const auto & h : sel.layers[0]) {
        EXPECT_EQ(h.kept, want);
    }
}

}  // namespace
