// The registry-wide matrix: every allocator x every scorer must satisfy the SPEC §2 invariants. A method is
// covered here as soon as it is registered.
#include "ecokv/ecokv.h"
#include "method-impl.h"
#include "test-capture-util.h"
#include "test-util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>

#include <unistd.h>

namespace {

constexpr int32_t k_layers = 3, k_heads = 4, k_kv_heads = 2, k_tokens = 120;

const ecokv::owned_capture & capture() {
    static const ecokv::owned_capture cap = [] {
        ecokv::synth_params p;
        p.n_layers = k_layers, p.n_heads = k_heads, p.n_kv_heads = k_kv_heads, p.head_dim = 16;
        p.n_tokens = k_tokens, p.n_queries = 32, p.full_queries = true, p.seed = 3;
        p.image_spans = { { 10, 70 } };
        return ecokv::make_synth_capture(p);
    }();
    return cap;
}

// A file that is removed when the process exits.
struct temp_file {
    std::string path;
    ~temp_file() { std::filesystem::remove(path); }
};

std::string head_score_file() {
    static const temp_file file{ [] {
        // One file per process: ctest runs the cases of this binary as parallel processes.
        const auto p = std::filesystem::temp_directory_path() /
                       ("ecokv-test-methods-head-scores-" + std::to_string(::getpid()) + ".json");
        std::ofstream out(p);
        out << "{";
        for (int32_t l = 0; l < k_layers; ++l) {
            for (int32_t h = 0; h < k_heads; ++h) {
                out << (l + h ? "," : "") << "\"" << l << "-" << h << "\": [" << 0.1 + 0.37 * ((l * 7 + h * 3) % 5)
                    << ", 0.2]";
            }
        }
        out << "}";
        return p.string();
    }() };
    return file.path;
}

struct combo {
    std::string allocator, scorer;
};

void PrintTo(const combo & c, std::ostream * os) { *os << c.allocator << "+" << c.scorer; }

std::vector<combo> all_combos() {
    std::vector<combo> out;
    for (const auto & a : ecokv::allocator_registry()) {
        for (const auto & s : ecokv::scorer_registry()) {
            out.push_back({ a.name, s.name });
        }
    }
    return out;
}

class methods : public ::testing::TestWithParam<combo> {
  protected:
    ecokv::method_spec spec() const { return { GetParam().allocator, GetParam().scorer }; }
    ecokv::method_params params(int32_t budget) const {
        ecokv::method_params p;
        p.budget      = budget;
        p.head_scores = head_score_file();
        return p;
    }
};

TEST_P(methods, budget_at_least_T_keeps_everything) {
    for (int32_t budget : { k_tokens, k_tokens + 50 }) {
        const auto sel = ecokv::compress(capture().view(), spec(), params(budget));
        for (const auto & layer : sel.layers) {
            for (const auto & h : layer) {
                ASSERT_EQ(h.kept.size(), size_t(k_tokens));
                for (int32_t t = 0; t < k_tokens; ++t) {
                    ASSERT_EQ(h.kept[t], t);
                }
            }
        }
        EXPECT_EQ(sel.kv_bytes_kept, sel.kv_bytes_full);
    }
}

TEST_P(methods, selections_are_valid_deterministic_and_keep_the_window) {
    const auto p   = params(48);
    const auto one = ecokv::compress(capture().view(), spec(), p, { 1 });
    const auto two = ecokv::compress(capture().view(), spec(), p, { 2 });
    const bool fixed = ecokv::find_allocator(spec().allocator).fixed_budget;  // pinned in registry.rows_by_hand
    for (size_t il = 0; il < one.layers.size(); ++il) {
        for (size_t ig = 0; ig < one.layers[il].size(); ++ig) {
            const auto & kept = one.layers[il][ig].kept;
            EXPECT_EQ(kept, two.layers[il][ig].kept) << "thread count changed the result";
            EXPECT_TRUE(std::is_sorted(kept.begin(), kept.end()));
            EXPECT_EQ(std::set<int32_t>(kept.begin(), kept.end()).size(), kept.size()) << "duplicates";
            ASSERT_FALSE(kept.empty());
            EXPECT_GE(kept.front(), 0);
            EXPECT_LT(kept.back(), k_tokens);
            for (int32_t t = k_tokens - one.window; t < k_tokens; ++t) {
                EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), t)) << "window token " << t << " evicted";
            }
            if (fixed) {
                EXPECT_EQ(kept.size(), size_t(std::min(k_tokens, p.budget)));
            }
        }
    }
}

// Prefix tokens kept over all heads, against the L * Hkv * C a uniform method keeps.
TEST_P(methods, allocators_conserve_the_total_budget) {
    const auto    p     = params(40);
    const auto    sel   = ecokv::compress(capture().view(), spec(), p);
    const int32_t c     = p.budget - sel.window;
    int64_t       total = 0;
    std::vector<int64_t> per_layer;
    for (const auto & layer : sel.layers) {
        int64_t n = 0;
        for (const auto & h : layer) {
            n += int64_t(h.kept.size()) - sel.window;
        }
        per_layer.push_back(n);
        total += n;
    }
    const int64_t uniform = int64_t(k_layers) * k_kv_heads * c;
    const std::string & a = spec().allocator;
    if (a == "adakv") {  // per layer, up to rounding of each head
        for (int64_t n : per_layer) {
            EXPECT_NEAR(double(n), double(k_kv_heads * c), k_kv_heads);
        }
    } else if (a == "sparsemm" || a == "madakv") {  // across layers, up to rounding of each head
        EXPECT_NEAR(double(total), double(uniform), k_layers * k_kv_heads);
    } else if (a == "pyramidkv") {  // integer steps overshoot (SPEC §6); layers never grow with depth
        EXPECT_GE(total, uniform);
        EXPECT_TRUE(std::is_sorted(per_layer.rbegin(), per_layer.rend()));
    } else {
        EXPECT_EQ(total, uniform);
    }
}

// compress_options::n_keep_last (a conversation's last turn): those tokens are all kept, beside the budget, and the
// choice among the tokens before them follows the scores. Uniform allocation: exactly the best B - N of [0, T - 40)
// by the scores score_heads gives, ties to the lower index (SPEC §2), picked here by a sort.
TEST_P(methods, protected_last_tokens_are_kept_beside_the_budget) {
    const int32_t n_keep = 40, budget = 48;  // more than any scorer's window
    const auto    p      = params(budget);
    const auto    sel    = ecokv::compress(capture().view(), spec(), p, { 1, n_keep });
    const auto    scores = ecokv::score_heads(capture().view(), spec(), p, { 1 });
    const int32_t c      = budget - sel.window;
    for (size_t i = 0; i < scores.size(); ++i) {
        const auto & kept = sel.layers[i / k_kv_heads][i % k_kv_heads].kept;
        const auto   mid  = std::lower_bound(kept.begin(), kept.end(), k_tokens - n_keep);
        ASSERT_EQ(kept.end() - mid, n_keep) << "head " << i << ": the protected tokens";
        if (spec().allocator != "uniform") {
            continue;  // the others move the budget between heads (allocators_conserve_the_total_budget)
        }
        std::vector<int32_t> order(size_t(k_tokens - n_keep));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return scores[i][a] > scores[i][b]; });
        order.resize(size_t(c));
        std::sort(order.begin(), order.end());
        EXPECT_EQ(std::vector<int32_t>(kept.begin(), mid), order) << "head " << i;
    }
}

// Per-head token sets (capture_view::heads, the chunked prefill's ragged candidates).

// The capture's own data, each (layer, KV head) given as its own token set: a view of its slice.
ecokv::capture_view as_per_head(const ecokv::capture_view & cap) {
    ecokv::capture_view v = cap;
    for (int32_t il = 0; il < cap.n_layers; ++il) {
        for (int32_t ig = 0; ig < cap.n_kv_heads; ++ig) {
            ecokv::head_tokens h;
            for (auto [from, to] : { std::pair{ &cap.layers[il].keys, &h.keys }, { &cap.layers[il].values, &h.values } }) {
                *to       = *from;
                to->data  = from->row(0, ig);
                to->ne[2] = 1;
            }
            h.modality = cap.modality;
            v.heads.push_back(std::move(h));
        }
        v.layers[il].keys = v.layers[il].values = v.layers[il].full_queries = {};
    }
    v.modality.clear();
    return v;
}

bool needs_full_queries(const ecokv::method_spec & m) {
    return (ecokv::find_scorer(m.scorer).needs | ecokv::find_allocator(m.allocator).needs) & ecokv::stat_accum_attention;
}

TEST_P(methods, per_head_tokens_holding_every_token_change_nothing) {
    const ecokv::capture_view heads = as_per_head(capture().view());
    for (int32_t budget : { 48, 72 }) {
        const auto p = params(budget);
        ecokv::capture_view with = heads;  // every token's queries, for the methods that accumulate attention
        for (size_t il = 0; il < with.layers.size() && needs_full_queries(spec()); ++il) {
            with.layers[il].full_queries = capture().view().layers[il].full_queries;
        }
        const auto want = ecokv::compress(capture().view(), spec(), p);
        const auto got  = ecokv::compress(with, spec(), p);
        for (size_t il = 0; il < want.layers.size(); ++il) {
            for (size_t ig = 0; ig < want.layers[il].size(); ++ig) {
                EXPECT_EQ(got.layers[il][ig].kept, want.layers[il][ig].kept) << il << "/" << ig;
                EXPECT_EQ(got.layers[il][ig].keys, want.layers[il][ig].keys);
            }
        }
        EXPECT_EQ(got.kv_bytes_full, want.kv_bytes_full);
    }
}

// Keys and values an engine stores encoded select exactly as their decoded values do (SPEC's methods applied to
// what the cache holds); the bytes counted are the encoded rows'.
TEST_P(methods, encoded_rows_select_as_their_decoded_values) {
    const ecokv::capture_view & cap = capture().view();
    ecokv::capture_view         enc = cap, dec = cap;
    std::vector<ecokv::test::encoded_tensor> store;
    store.reserve(size_t(cap.n_layers) * 2);
    for (int32_t il = 0; il < cap.n_layers; ++il) {
        for (const bool is_v : { false, true }) {
            const ecokv::tensor_view & src = is_v ? cap.layers[il].values : cap.layers[il].keys;
            const auto &               e   = store.emplace_back(ecokv::test::encode(src));
            (is_v ? enc.layers[il].values : enc.layers[il].keys) = ecokv::test::encoded_view(e, src);
            (is_v ? dec.layers[il].values : dec.layers[il].keys) =
                ecokv::tensor_view::packed(e.decoded.data(), ecokv::dtype::f32, { src.ne[2], src.ne[1], src.ne[0] });
        }
    }
    const auto p    = params(48);
    const auto got  = ecokv::compress(enc, spec(), p);
    const auto want = ecokv::compress(dec, spec(), p);
    for (size_t il = 0; il < want.layers.size(); ++il) {
        for (size_t ig = 0; ig < want.layers[il].size(); ++ig) {
            EXPECT_EQ(got.layers[il][ig].kept, want.layers[il][ig].kept) << il << "/" << ig;
            EXPECT_EQ(got.layers[il][ig].keys, want.layers[il][ig].keys);
            EXPECT_EQ(got.layers[il][ig].values, want.layers[il][ig].values);
        }
    }
    // an entry: K and V rows of one 16-element block each, 20 bytes apiece
    EXPECT_EQ(got.kv_bytes_full, uint64_t(k_layers) * k_kv_heads * k_tokens * 40);
    EXPECT_EQ(got.kv_bytes_kept, uint64_t(got.n_kept()) * 40);
}

// Rows `tokens` of slice `slice` of `v`, packed as F32 [1][n][ne0] in `store`.
ecokv::tensor_view gather(const ecokv::tensor_view & v, int64_t slice, const std::vector<int32_t> & tokens,
                          std::vector<float> & store) {
    const int64_t d = v.ne[0];
    store.resize(tokens.size() * d);
    for (size_t t = 0; t < tokens.size(); ++t) {
        v.row_f32(tokens[t], slice, store.data() + t * d);
    }
    return ecokv::tensor_view::packed(store.data(), ecokv::dtype::f32, { 1, int64_t(tokens.size()), d });
}

// Every head holds its own subset of the tokens (sizes differ): with the uniform allocator, each head's selection
// is what the scorer selects on a capture made of that head's tokens alone, built here by copying them. Every
// scorer but random (seeded by the head's index) and those needing every prompt query.
void expect_subsets_select_as_their_own_capture(const ecokv::method_spec & spec) {
    const ecokv::capture_view & cap = capture().view();
    const int32_t              group = cap.n_heads / cap.n_kv_heads;
    ecokv::capture_view        ragged = cap;
    std::vector<std::vector<float>>   store;
    std::vector<std::vector<int32_t>> kept_tokens;
    store.reserve(size_t(cap.n_layers) * cap.n_kv_heads * 4);
    ragged.modality.clear();
    for (int32_t il = 0; il < cap.n_layers; ++il) {
        for (int32_t ig = 0; ig < cap.n_kv_heads; ++ig) {
            std::vector<int32_t> tokens;  // drops a different share of the prefix in every head; the window stays
            for (int32_t t = 0; t < cap.n_tokens; ++t) {
                if (t >= cap.n_tokens - cap.n_queries || (t * 7 + il * 5 + ig * 3) % (il + ig + 3) != 0) {
                    tokens.push_back(t);
                }
            }
            ecokv::head_tokens h;
            h.keys   = gather(cap.layers[il].keys, ig, tokens, store.emplace_back());
            h.values = gather(cap.layers[il].values, ig, tokens, store.emplace_back());
            for (int32_t t : tokens) {
                h.modality.push_back(cap.modality[t]);
            }
            ragged.heads.push_back(std::move(h));
            kept_tokens.push_back(std::move(tokens));
        }
        ragged.layers[il].keys = ragged.layers[il].values = ragged.layers[il].full_queries = {};
    }
    ecokv::method_params p;
    p.budget       = 48;
    const auto got = ecokv::compress(ragged, spec, p);
    for (int32_t il = 0; il < cap.n_layers; ++il) {
        for (int32_t ig = 0; ig < cap.n_kv_heads; ++ig) {
            const std::vector<int32_t> & tokens = kept_tokens[size_t(il) * cap.n_kv_heads + ig];
            ecokv::capture_view          one;  // layer il's KV head ig alone, with its query group
            one.n_layers = 1, one.n_heads = group, one.n_kv_heads = 1, one.head_dim = cap.head_dim;
            one.head_dim_v = cap.head_dim_v, one.n_tokens = int32_t(tokens.size()), one.n_queries = cap.n_queries;
            std::vector<int32_t> all_queries(size_t(cap.n_queries));
            std::iota(all_queries.begin(), all_queries.end(), 0);
            ecokv::layer_capture l;
            l.keys   = gather(cap.layers[il].keys, ig, tokens, store.emplace_back());
            l.values = gather(cap.layers[il].values, ig, tokens, store.emplace_back());
            std::vector<float> & q = store.emplace_back(size_t(group) * cap.n_queries * cap.head_dim);
            for (int32_t h = 0; h < group; ++h) {
                for (int32_t i = 0; i < cap.n_queries; ++i) {
                    cap.layers[il].queries.row_f32(i, ig * group + h, q.data() + (size_t(h) * cap.n_queries + i) * cap.head_dim);
                }
            }
            l.queries = ecokv::tensor_view::packed(q.data(), ecokv::dtype::f32, { group, cap.n_queries, cap.head_dim });
            one.layers = { l };
            for (int32_t t : tokens) {
                one.modality.push_back(cap.modality[t]);
            }
            const auto want = ecokv::compress(one, spec, p);
            EXPECT_EQ(got.layers[il][ig].kept, want.layers[0][0].kept) << spec.name() << " " << il << "/" << ig;
        }
    }
}

TEST(per_head_tokens, subsets_select_as_their_own_capture) {
    int n = 0;
    for (const auto & s : ecokv::scorer_registry()) {
        const ecokv::method_spec spec{ "uniform", s.name };
        if (std::string(s.name) != "random" && !needs_full_queries(spec)) {
            expect_subsets_select_as_their_own_capture(spec);
            ++n;
        }
    }
    EXPECT_GE(n, 8);
}

TEST(per_head_tokens, bad_sets_are_refused) {
    const ecokv::capture_view heads = as_per_head(capture().view());
    ecokv::method_params      p;
    p.budget = 48;
    ecokv::capture_view short_set = heads;
    short_set.heads.pop_back();
    EXPECT_THROW(ecokv::compress(short_set, { "uniform", "snapkv" }, p), ecokv::error);
    ecokv::capture_view too_few = heads;
    too_few.heads[1].keys.ne[1] = too_few.heads[1].values.ne[1] = 8;  // fewer than the 32 window queries
    too_few.heads[1].modality.resize(8);
    EXPECT_THROW(ecokv::compress(too_few, { "uniform", "snapkv" }, p), ecokv::error);
    ecokv::capture_view too_many_queries = heads;  // full queries of more tokens than head 1 holds
    too_many_queries.layers = capture().view().layers;
    for (auto & l : too_many_queries.layers) {
        l.keys = l.values = {};
        l.full_queries.ne[1] = 40;
    }
    too_many_queries.heads[1].keys.ne[1] = too_many_queries.heads[1].values.ne[1] = 36;
    too_many_queries.heads[1].modality.resize(36);
    EXPECT_EQ(ecokv::test::error_of([&] { ecokv::compress(too_many_queries, { "uniform", "h2o" }, p); }),
              "heads.1.keys holds 36 tokens, fewer than the 40 full queries");
    ecokv::capture_view bad_prior = heads;
    bad_prior.heads[2].prior_attention.assign(5, 0.0f);
    EXPECT_EQ(ecokv::test::error_of([&] { ecokv::compress(bad_prior, { "uniform", "snapkv" }, p); }),
              "heads.2.prior_attention holds 5 values for 120 tokens");
    bad_prior.heads[2].prior_attention.assign(k_tokens, -1.0f);
    EXPECT_EQ(ecokv::test::error_of([&] { ecokv::compress(bad_prior, { "uniform", "snapkv" }, p); }),
              "heads.2.prior_attention holds -1 (accumulated attention is finite and >= 0)");
}

// Streaming H2O: compressing the first 70 tokens with a budget that keeps them all, then the 120 with the queries of
// the last 50 only and each token's attention so far as its prior, selects exactly what one compression of the 120
// with every query selects, with the same accumulated attention (no token was evicted in between, so every query saw
// the same keys).
TEST(per_head_tokens, streaming_h2o_accumulates_as_one_compression) {
    const ecokv::capture_view & cap = capture().view();
    ecokv::method_params        p;
    p.budget = 48;
    const ecokv::method_spec h2o = { "uniform", "h2o" };
    const auto               whole = ecokv::compress(cap, h2o, p);
    ecokv::capture_view      first = cap;  // tokens [0, 70) and their queries
    first.n_tokens = 70;
    for (auto & l : first.layers) {
        l.keys.ne[1] = l.values.ne[1] = l.full_queries.ne[1] = 70;
        l.queries.data = l.full_queries.row(70 - 32);  // the window: queries of tokens 38..69
    }
    first.modality.resize(70);
    ecokv::method_params keep_all = p;
    keep_all.budget = 70;
    const auto          step = ecokv::compress(first, h2o, keep_all);
    ecokv::capture_view rest = as_per_head(cap);  // all 120 tokens, the full queries of 70..119
    for (auto & l : rest.layers) {
        l.full_queries       = cap.layers[&l - rest.layers.data()].full_queries;
        l.full_queries.data  = l.full_queries.row(70);
        l.full_queries.ne[1] = 50;
    }
    for (size_t i = 0; i < rest.heads.size(); ++i) {
        const auto & acc = step.layers[i / k_kv_heads][i % k_kv_heads].accumulated;
        ASSERT_EQ(acc.size(), 70u);
        rest.heads[i].prior_attention = acc;
        rest.heads[i].prior_attention.resize(k_tokens, 0.0f);
    }
    const auto streamed = ecokv::compress(rest, h2o, p);
    for (size_t il = 0; il < whole.layers.size(); ++il) {
        for (size_t ig = 0; ig < whole.layers[il].size(); ++ig) {
            const auto &w = whole.layers[il][ig], &s = streamed.layers[il][ig];
            EXPECT_EQ(s.kept, w.kept) << il << "/" << ig;
            ASSERT_EQ(s.accumulated.size(), w.accumulated.size());
            for (size_t j = 0; j < w.accumulated.size(); ++j) {
                EXPECT_NEAR(s.accumulated[j], w.accumulated[j], 1e-5 * std::max(1.0f, w.accumulated[j]));
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(registry, methods, ::testing::ValuesIn(all_combos()),
                         [](const ::testing::TestParamInfo<combo> & info) {
                             std::string n = info.param.allocator + "_" + info.param.scorer;
                             std::replace(n.begin(), n.end(), '-', '_');
                             return n;
                         });

TEST(registry, lists_every_spec_method) {
    std::set<std::string> names;
    for (const auto & m : ecokv::list_methods()) {
        names.insert(m.name);
    }
    for (const char * n : { "snapkv", "knorm", "vnorm", "keydiff", "manifoldkv", "mixkv", "ecokv", "h2o",
                            "streamingllm", "random", "uniform", "pyramidkv", "adakv", "sparsemm", "madakv", "lookm" }) {
        EXPECT_TRUE(names.count(n)) << n;
    }
}

// What every registry row must say, written by hand from the papers and SPEC rather than read from the registry:
// a new method adds its line here.
struct scorer_row {
    int32_t window;        // default observation window N
    bool    full_queries;  // accumulated attention over every prompt query
};

struct allocator_row {
    bool full_queries, modality, head_scores, fixed_budget;
};

const std::map<std::string, scorer_row> k_scorer_rows = {
    { "snapkv", { 32, false } },      { "knorm", { 32, false } },   { "knorm-only", { 32, false } },
    { "vnorm", { 32, false } },       { "keydiff", { 32, false } }, { "manifoldkv", { 32, false } },
    { "mixkv", { 32, false } },       { "ecokv", { 4, false } },    { "h2o", { 32, true } },
    { "streamingllm", { 4, false } }, { "random", { 32, false } },
};

const std::map<std::string, allocator_row> k_allocator_rows = {
    // full queries, modality, head scores, fixed budget
    { "uniform", { false, false, false, true } }, { "pyramidkv", { false, false, false, false } },
    { "adakv", { false, false, false, false } },  { "sparsemm", { false, false, true, false } },
    { "madakv", { false, true, false, false } },  { "lookm", { false, true, false, true } },
};

TEST(registry, rows_by_hand) {
    std::set<std::string> scorers, allocators;
    for (const auto & s : ecokv::scorer_registry()) {
        scorers.insert(s.name);
        EXPECT_TRUE(k_scorer_rows.count(s.name)) << s.name << " is registered but missing from k_scorer_rows";
    }
    for (const auto & a : ecokv::allocator_registry()) {
        allocators.insert(a.name);
        EXPECT_TRUE(k_allocator_rows.count(a.name)) << a.name << " is registered but missing from k_allocator_rows";
    }
    EXPECT_EQ(scorers.size(), k_scorer_rows.size());
    EXPECT_EQ(allocators.size(), k_allocator_rows.size());
    for (const auto & m : ecokv::list_methods()) {
        EXPECT_EQ(m.fixed_budget, m.kind == "allocator" && k_allocator_rows.at(m.name).fixed_budget) << m.name;
    }
    for (const auto & a : ecokv::allocator_registry()) {
        EXPECT_EQ(a.fixed_budget, k_allocator_rows.at(a.name).fixed_budget) << a.name;
    }
}

// requirements() of every allocator x scorer is the union of the two rows; the window is the scorer's default
// unless params.window is set.
TEST(registry, requirements_follow_the_rows) {
    for (const auto & [a, ar] : k_allocator_rows) {
        for (const auto & [s, sr] : k_scorer_rows) {
            const ecokv::method_spec spec{ a, s };
            for (int32_t window : { -1, 7 }) {
                ecokv::method_params p;
                p.window                              = window;
                const ecokv::method_requirements r    = ecokv::requirements(spec, p);
                const std::string                what = a + "+" + s + " window " + std::to_string(window);
                EXPECT_EQ(r.n_window_queries, window < 0 ? sr.window : window) << what;
                EXPECT_EQ(r.full_queries, sr.full_queries || ar.full_queries) << what;
                EXPECT_EQ(r.modality, ar.modality) << what;
                EXPECT_EQ(r.head_scores, ar.head_scores) << what;
            }
        }
    }
    // The bare names, as the README lists their needs.
    const auto bare = [](const char * name) { return ecokv::requirements(ecokv::parse_method(name), {}); };
    EXPECT_TRUE(bare("h2o").full_queries);
    EXPECT_TRUE(bare("lookm").full_queries);  // lookm+h2o
    EXPECT_TRUE(bare("lookm").modality);
    EXPECT_TRUE(bare("madakv").modality);
    EXPECT_FALSE(bare("madakv").full_queries);
    EXPECT_TRUE(bare("sparsemm").head_scores);
    EXPECT_EQ(bare("ecokv").n_window_queries, 4);
    EXPECT_EQ(bare("pyramidkv").n_window_queries, 32);
}

// One capture serving several methods needs the union of their needs and the largest window.
TEST(registry, requirements_union) {
    ecokv::method_requirements r = ecokv::requirements(ecokv::parse_method("ecokv"), {});
    r |= ecokv::requirements(ecokv::parse_method("sparsemm"), {});
    EXPECT_EQ(r.n_window_queries, 32);
    EXPECT_TRUE(r.head_scores);
    EXPECT_FALSE(r.full_queries);
    EXPECT_FALSE(r.modality);
    r |= ecokv::requirements(ecokv::parse_method("lookm"), {});
    EXPECT_TRUE(r.full_queries);
    EXPECT_TRUE(r.modality);
    EXPECT_TRUE(r.head_scores);
}

TEST(registry, grammar_and_aliases) {
    EXPECT_EQ(ecokv::parse_method("ecokv").name(), "uniform+ecokv");
    EXPECT_EQ(ecokv::parse_method("snapkv").name(), "uniform+snapkv");
    EXPECT_EQ(ecokv::parse_method("snapkv+ecokv").name(), "uniform+ecokv");
    EXPECT_EQ(ecokv::parse_method("pyramidkv").name(), "pyramidkv+snapkv");
    EXPECT_EQ(ecokv::parse_method("lookm").name(), "lookm+h2o");
    EXPECT_EQ(ecokv::parse_method("adakv+mixkv").name(), "adakv+mixkv");
    EXPECT_EQ(ecokv::method_window(ecokv::parse_method("pyramidkv+ecokv"), {}), 4);
    EXPECT_EQ(ecokv::method_window(ecokv::parse_method("adakv"), {}), 32);
    for (const char * bad : { "snapk", "", "+", "adakv+", "ecokv+snapkv", "a+b+c", "uniform+pyramidkv" }) {
        EXPECT_THROW(ecokv::parse_method(bad), ecokv::error) << bad;
    }
    try {
        ecokv::parse_method("snapk");
    } catch (const ecokv::error & e) {
        EXPECT_NE(std::string(e.what()).find("unknown method 'snapk'; known: snapkv"), std::string::npos) << e.what();
    }
}

TEST(registry, budget_not_above_window_is_an_error) {
    ecokv::method_params p;
    p.budget = 4;
    try {
        ecokv::compress(capture().view(), ecokv::parse_method("ecokv"), p);
        FAIL() << "no error";
    } catch (const ecokv::error & e) {
        EXPECT_STREQ(e.what(), "--budget 4 must be larger than --window 4 (the budget includes the window)");
    }
}

}  // namespace
