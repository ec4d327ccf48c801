// The llama.cpp adapter on random-weight models built in memory, against the plain C++ reference forward of
// tiny-model.cpp: (a) a budget covering the prompt changes nothing; (b) compaction into a smaller context gives
// the logits of the full cache with the evicted entries masked, for uniform and non-uniform budgets; (c) decoding
// continues at the original positions, M-RoPE included; (d) the capture holds the cache's own K/V and the
// post-RoPE queries.
#include "ecokv/llama-adapter.h"
#include "ecokv/llama-generate.h"
#include "tiny-model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace {

using namespace ecokv::test;
namespace el = ecokv::llama;

// llama.cpp's log only for errors.
const bool quiet = [] {
    llama_log_set([](ggml_log_level level, const char * text, void *) {
        if (level == GGML_LOG_LEVEL_ERROR) {
            std::fputs(text, stderr);
        }
    }, nullptr);
    return true;
}();

llama_context_params context_params(int32_t n_ctx) {
    llama_context_params p = llama_context_default_params();
    p.n_ctx                = uint32_t(n_ctx);
    p.n_batch = p.n_ubatch = uint32_t(n_ctx);
    p.n_seq_max            = 1;
    p.n_threads = p.n_threads_batch = 2;
    return p;
}

// A prefilled context with its capture, as ecokv run builds it.
struct prefill {
    const tiny_model &    model;
    el::query_capture     capture;
    el::context_ptr       ctx;
    std::vector<int32_t>  tokens;
    std::vector<position> positions;

    prefill(const tiny_model & m, std::vector<int32_t> tok, std::vector<position> pos, int32_t n_queries = 32) :
        model(m), capture(m.get(), n_queries, true), tokens(std::move(tok)), positions(std::move(pos)) {
        llama_context_params p = context_params(512);
        capture.attach(p);
        ctx.reset(llama_init_from_model(m.get(), p));
        EXPECT_EQ(decode_prompt(ctx.get(), m, tokens, positions), 0);
        capture.set_active(false);
    }

    std::vector<uint8_t> modality() const {
        std::vector<uint8_t> out;
        for (size_t i = 0; i < positions.size(); ++i) {
            const bool image = positions[i][1] != positions[i][0] || positions[i][2] != positions[i][0] ||
                               (i > 0 && positions[i - 1][0] == positions[i][0]) ||
                               (i + 1 < positions.size() && positions[i + 1][0] == positions[i][0]);
            out.push_back(image ? 1 : 0);
        }
        return out;
    }
};

ecokv::method_params budget(int32_t b, int32_t window = -1) {
    ecokv::method_params p;
    p.budget = b;
    p.window = window;
    return p;
}

// Decodes `next` one token at a time into the compressed context from position t0 and compares every step's
// logits with the reference in which the new tokens see only the kept prompt entries (and each other).
void expect_masked_reference(const prefill & pf, el::compressed_cache & cc, const std::vector<int32_t> & next,
                             int32_t t0) {
    const int32_t n_prompt = int32_t(pf.tokens.size());
    auto          keep     = [&](int32_t il, int32_t g, int32_t qi, int32_t kj) {
        if (qi < n_prompt || kj >= n_prompt) {
            return true;
        }
        const auto & kept = cc.sel.layers[il][g].kept;
        return std::binary_search(kept.begin(), kept.end(), kj);
    };
    std::vector<int32_t>  tokens    = pf.tokens;
    std::vector<position> positions = pf.positions;
    for (size_t s = 0; s < next.size(); ++s) {
        const std::vector<float> got = el::decode(cc.ctx.get(), { next[s] }, t0 + int32_t(s));
        tokens.push_back(next[s]);
        positions.push_back({ t0 + int32_t(s), t0 + int32_t(s), t0 + int32_t(s) });
        const std::vector<float> want = reference_logits(pf.model, tokens, positions, keep);
        const std::vector<float> full = reference_logits(pf.model, tokens, positions);
        EXPECT_LT(rel_diff(got, want), logit_rel_tolerance) << "decode step " << s;
        // The test has power: the unmasked reference is measurably different.
        EXPECT_GT(rel_diff(got, full), 3 * logit_rel_tolerance) << "decode step " << s;
    }
}

TEST(adapter, budget_covering_the_prompt_keeps_the_full_cache_logits) {
    const tiny_model m = make_tiny_model({});
    const auto       tokens = prompt_tokens(24, m.config().n_vocab, 7);
    prefill          pf(m, tokens, text_positions(24));
    const el::prefill_state state(pf.ctx.get(), pf.capture, {});
    el::compressed_cache cc = el::compress_context(m.get(), state, ecokv::parse_method("snapkv+ecokv"), budget(64), 8,
                                                   context_params(32));
    EXPECT_EQ(cc.n_cells, 24);
    for (int32_t s = 0; s < 4; ++s) {
        const int32_t            tok  = 3 + 11 * s;
        const std::vector<float> full = el::decode(pf.ctx.get(), { tok }, 24 + s);
        const std::vector<float> got  = el::decode(cc.ctx.get(), { tok }, 24 + s);
        EXPECT_LT(rel_diff(got, full), 1e-5) << "step " << s;
    }
}

TEST(adapter, uniform_compaction_equals_the_masked_reference) {
    const tiny_model m = make_tiny_model({});
    prefill          pf(m, prompt_tokens(40, m.config().n_vocab, 11), text_positions(40));
    const el::prefill_state state(pf.ctx.get(), pf.capture, {});
    el::compressed_cache cc = el::compress_context(m.get(), state, ecokv::parse_method("snapkv+ecokv"), budget(12), 8,
                                                   context_params(32));
    EXPECT_EQ(cc.n_cells, 12);
    EXPECT_TRUE(cc.bias.empty());
    EXPECT_LT(cc.kv_bytes_alloc, el::kv_bytes_allocated(pf.ctx.get(), state.kv_bytes_per_cell()));
    expect_masked_reference(pf, cc, { 5, 77, 23 }, 40);
}

TEST(adapter, non_uniform_budgets_hide_their_padding) {
    tiny_config c;
    c.n_layer          = 3;
    const tiny_model m = make_tiny_model(c);
    prefill          pf(m, prompt_tokens(48, c.n_vocab, 5), text_positions(48));
    const el::prefill_state state(pf.ctx.get(), pf.capture, {});
    for (const char * method : { "pyramidkv+ecokv", "adakv+snapkv" }) {
        SCOPED_TRACE(method);
        el::compressed_cache cc = el::compress_context(m.get(), state, ecokv::parse_method(method), budget(14, 4), 8,
                                                       context_params(64));
        ASSERT_FALSE(cc.bias.empty()) << "expected different budgets per head";
        expect_masked_reference(pf, cc, { 9, 31, 64 }, 48);
    }
}

TEST(adapter, mrope_positions_continue_after_an_image) {
    tiny_config c;
    c.arch             = "qwen2vl";
    const tiny_model m = make_tiny_model(c);
    // 6 text tokens, a 4x3 image at t = 6 (advances t by max(4, 3)), 10 text tokens from t = 10.
    std::vector<position> pos = text_positions(6);
    for (const position & p : image_positions(6, 4, 3)) {
        pos.push_back(p);
    }
    for (const position & p : text_positions(10, 10)) {
        pos.push_back(p);
    }
    prefill                 pf(m, prompt_tokens(int32_t(pos.size()), c.n_vocab, 3), pos, 16);
    const el::prefill_state state(pf.ctx.get(), pf.capture, pf.modality());
    EXPECT_EQ(state.pos_max(), 19);
    el::compressed_cache cc = el::compress_context(m.get(), state, ecokv::parse_method("snapkv+ecokv"), budget(12), 8,
                                                   context_params(32));
    expect_masked_reference(pf, cc, { 4, 8 }, 20);  // the next text position is 20, not the token count 28
}

TEST(adapter, capture_holds_the_cache_and_the_post_rope_queries) {
    for (const char * arch : { "llama", "qwen2vl" }) {
        SCOPED_TRACE(arch);
        tiny_config c;
        c.arch                  = arch;
        const tiny_model m      = make_tiny_model(c);
        prefill          pf(m, prompt_tokens(40, c.n_vocab, 13), text_positions(40), 32);
        const el::prefill_state state(pf.ctx.get(), pf.capture, {});
        const ecokv::capture_view & v   = state.view();
        const auto                  ref = reference_kv(m, pf.tokens, pf.positions);
        ASSERT_EQ(v.n_tokens, 40);
        ASSERT_EQ(v.n_queries, 32);
        const int32_t d = v.head_dim;
        std::vector<float> row(static_cast<size_t>(d));
        double worst_kv = 0, worst_q = 0;
        for (int32_t il = 0; il < v.n_layers; ++il) {
            for (int32_t g = 0; g < v.n_kv_heads; ++g) {
                for (int32_t t = 0; t < 40; ++t) {
                    for (const auto & [view, ref_data] : { std::pair{ &v.layers[il].keys, &ref[il].k },
                                                           std::pair{ &v.layers[il].values, &ref[il].v } }) {
                        view->row_f32(t, g, row.data());
                        for (int32_t e = 0; e < d; ++e) {
                            const double r = (*ref_data)[(size_t(g) * 40 + t) * d + e];
                            worst_kv = std::max(worst_kv, std::fabs(row[e] - r) / (std::fabs(r) * 4e-3 + 2e-3));
                        }
                    }
                }
            }
            for (int32_t h = 0; h < v.n_heads; ++h) {
                for (int32_t i = 0; i < 32; ++i) {
                    v.layers[il].queries.row_f32(i, h, row.data());
                    for (int32_t e = 0; e < d; ++e) {
                        const double r = ref[il].q[(size_t(h) * 40 + 8 + i) * d + e];
                        worst_q = std::max(worst_q, std::fabs(row[e] - r) / (std::fabs(r) * 4e-3 + 2e-3));
                    }
                }
            }
        }
        EXPECT_LE(worst_kv, 1.0) << "cache K/V differ from the reference beyond F16 rounding";
        EXPECT_LE(worst_q, 1.0) << "captured queries differ from the reference";
    }
}

}  // namespace
