// The llama.cpp adapter on random-weight models built in memory, against the plain C++ reference forward of
// tiny-model.cpp: (a) a budget covering the prompt changes nothing; (b) the ragged cache of the kept entries gives
// the logits of the full cache with the evicted entries masked, for uniform and non-uniform budgets, in a new
// context or in place, and allocates exactly the kept entries plus the room asked for; (c) decoding continues at the
// original positions, M-RoPE included; (d) the capture holds the cache's own K/V and the post-RoPE queries.
#include "ecokv/llama-adapter.h"
#include "ecokv/llama-session.h"
#include "ecokv/llama-generate.h"
#include "tiny-model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

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

llama_context_params context_params(int32_t n_ctx, bool flash = true) {
    llama_context_params p = llama_context_default_params();
    p.n_ctx                = uint32_t(n_ctx);
    p.flash_attn_type      = flash ? LLAMA_FLASH_ATTN_TYPE_AUTO : LLAMA_FLASH_ATTN_TYPE_DISABLED;
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

    prefill(const tiny_model & m, std::vector<int32_t> tok, std::vector<position> pos, int32_t n_queries = 32,
            bool flash = true) :
        model(m), capture(m.get(), n_queries, true), tokens(std::move(tok)), positions(std::move(pos)) {
        llama_context_params p = context_params(512, flash);
        capture.attach(p);
        ctx.reset(llama_init_from_model(m.get(), p));
        EXPECT_EQ(decode_prompt(ctx.get(), m, tokens, positions), 0);
        capture.set_active(false);
    }

    // The cache as an ecokv capture; the next position follows the prompt's last.
    el::prefill_state state(std::vector<uint8_t> modality = {}) const {
        return el::prefill_state(ctx.get(), capture, std::move(modality), int32_t(tokens.size()),
                                 positions.back()[0] + 1);
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
void expect_masked_reference(const prefill & pf, llama_context * ctx, const ecokv::selection & sel,
                             const std::vector<int32_t> & next, int32_t t0) {
    const int32_t        n_prompt = int32_t(pf.tokens.size());
    std::vector<int32_t> layer_of;  // model layer -> selection layer; -1: a sliding-window layer, not compressed
    for (int32_t il = 0, i = 0; il < pf.model.config().n_layer; ++il) {
        layer_of.push_back(pf.model.is_swa(il) ? -1 : i++);
    }
    ASSERT_EQ(int32_t(sel.layers.size()), int32_t(std::count_if(layer_of.begin(), layer_of.end(), [](int32_t i) { return i >= 0; })));
    auto keep = [&](int32_t il, int32_t g, int32_t qi, int32_t kj) {
        if (qi < n_prompt || kj >= n_prompt || layer_of[size_t(il)] < 0) {
            return true;  // a sliding-window layer sees its window, as in llama.cpp (the reference masks it)
        }
        const auto & kept = sel.layers[size_t(layer_of[size_t(il)])][g].kept;
        return std::binary_search(kept.begin(), kept.end(), kj);
    };
    std::vector<int32_t>  tokens    = pf.tokens;
    std::vector<position> positions = pf.positions;
    for (size_t s = 0; s < next.size(); ++s) {
        const std::vector<float> got = el::decode(ctx, { next[s] }, t0 + int32_t(s));
        tokens.push_back(next[s]);
        positions.push_back({ t0 + int32_t(s), t0 + int32_t(s), t0 + int32_t(s) });
        const std::vector<float> want = reference_logits(pf.model, tokens, positions, keep);
        const std::vector<float> full = reference_logits(pf.model, tokens, positions);
        EXPECT_LT(rel_diff(got, want), logit_rel_tolerance) << "decode step " << s;
        // The test has power: the unmasked reference is measurably different.
        EXPECT_GT(rel_diff(got, full), 3 * logit_rel_tolerance) << "decode step " << s;
    }
}

// The ragged cache's bytes counted by hand: per layer and KV head, the kept entries, the label cell and the room,
// each head_dim F16 values of K and of V.
uint64_t ragged_bytes(const ecokv::selection & sel, int32_t n_room, int32_t head_dim) {
    uint64_t rows = 0;
    for (const auto & layer : sel.layers) {
        for (const auto & h : layer) {
            rows += h.kept.size() + 1 + uint64_t(n_room);
        }
    }
    return rows * 2 * uint64_t(head_dim) * 2;
}

TEST(adapter, budget_covering_the_prompt_keeps_the_full_cache_logits) {
    const tiny_model m = make_tiny_model({});
    const auto       tokens = prompt_tokens(24, m.config().n_vocab, 7);
    prefill          pf(m, tokens, text_positions(24));
    const el::prefill_state state = pf.state();
    el::compressed_cache cc = el::compress_context(m.get(), state, ecokv::parse_method("snapkv+ecokv"), budget(64), 8,
                                                   context_params(32));
    for (const auto & layer : cc.sel.layers) {
        for (const auto & h : layer) {
            EXPECT_EQ(h.kept.size(), 24u);
        }
    }
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
    const el::prefill_state state = pf.state();
    el::compressed_cache cc = el::compress_context(m.get(), state, ecokv::parse_method("snapkv+ecokv"), budget(12), 8,
                                                   context_params(32));
    EXPECT_EQ(el::kv_bytes_allocated(cc.ctx.get()), ragged_bytes(cc.sel, 8, m.config().head_dim()));
    EXPECT_EQ(el::kv_bytes_allocated(cc.ctx.get()), 2u * 2 * (12 + 1 + 8) * 2 * 16 * 2);  // 2 layers x 2 heads
    expect_masked_reference(pf, cc.ctx.get(), cc.sel, { 5, 77, 23 }, 40);
}

// In place, the full cache is replaced by the kept entries: the same logits, the memory of the kept entries only.
TEST(adapter, in_place_compaction_equals_the_masked_reference) {
    const tiny_model m = make_tiny_model({});
    prefill          pf(m, prompt_tokens(40, m.config().n_vocab, 11), text_positions(40));
    EXPECT_EQ(el::kv_bytes_allocated(pf.ctx.get()), 512u * 2 * 2 * 2 * 16 * 2);  // 512 cells, 2 layers, 2 heads
    el::compressed_cache cc = el::compress_context(m.get(), pf.state(), ecokv::parse_method("pyramidkv+ecokv"),
                                                   budget(14, 4), 6, {}, nullptr, true);
    EXPECT_EQ(cc.ctx, nullptr);
    EXPECT_EQ(llama_kv_layout(pf.ctx.get()), 2);
    EXPECT_EQ(el::kv_bytes_allocated(pf.ctx.get()), ragged_bytes(cc.sel, 6, m.config().head_dim()));
    expect_masked_reference(pf, pf.ctx.get(), cc.sel, { 5, 77, 23, 8, 1, 60 }, 40);
}

// The pattern that corrupted memory on lavapipe (docs/gpu.md, tests/gpu/reserve-after-callback.cpp), 200 times: a
// context whose eval callback splits its graphs is reserved again (causal attention toggled) before every decode.
// Each decode of the same token at the same position gives the reference forward's logits.
TEST(adapter, a_context_reserved_again_after_its_callback_ran_decodes_as_the_reference) {
    const tiny_model     m      = make_tiny_model({});
    std::vector<int32_t> tokens = prompt_tokens(40, m.config().n_vocab, 13);
    llama_context_params p      = context_params(64);
    p.cb_eval = [](ggml_tensor * t, bool ask, void *) {
        if (ask) {
            return std::strncmp(t->name, "Qcur-", 5) == 0 && t->op == GGML_OP_ROPE;
        }
        std::vector<float> q(size_t(ggml_nelements(t)));
        ggml_backend_tensor_get(t, q.data(), 0, ggml_nbytes(t));
        return true;
    };
    el::context_ptr ctx(llama_init_from_model(m.get(), p));
    ASSERT_EQ(decode_prompt(ctx.get(), m, tokens, text_positions(40)), 0);
    const int32_t next = 17;
    tokens.push_back(next);
    const std::vector<float> want = reference_logits(m, tokens, text_positions(41));
    for (int r = 0; r < 200; ++r) {
        llama_set_causal_attn(ctx.get(), false);  // sched_need_reserve: the next decode reserves again
        llama_set_causal_attn(ctx.get(), true);
        llama_memory_seq_rm(llama_get_memory(ctx.get()), 0, 40, -1);
        const std::vector<float> got = el::decode(ctx.get(), { next }, 40);
        ASSERT_LT(rel_diff(got, want), logit_rel_tolerance) << "round " << r;
    }
}

// The bytes of llama.cpp's own sliding-window stores (an iSWA model's), which a compression leaves as they are.
uint64_t sliding_bytes(const tiny_model & m, llama_context * ctx) {
    uint64_t n = 0;
    for (int32_t il = 0; il < m.config().n_layer; ++il) {
        if (m.is_swa(il)) {
            EXPECT_LE(llama_kv_store(ctx, il, false)->ne[1], 256) << "a window of " << m.n_swa() << " and a ubatch";
            n += ggml_nbytes(llama_kv_store(ctx, il, false)) + ggml_nbytes(llama_kv_store(ctx, il, true));
        }
    }
    return n;
}

// Every head keeps its own count and allocates exactly that, on llama, qwen2, qwen2vl, qwen3vl and gemma3 (whose
// sliding-window layers keep llama.cpp's cache: the selection covers its global layers), with or without flash
// attention (V transposed in the prefill context).
TEST(adapter, non_uniform_budgets_allocate_what_each_head_keeps) {
    for (const char * arch : { "llama", "qwen2", "qwen2vl", "qwen3vl", "gemma3" }) {
        for (const bool flash : { true, false }) {
            tiny_config c;
            c.arch             = arch;
            c.n_layer          = std::string(arch) == "gemma3" ? 4 : 3;  // gemma3: global layers 1 and 3
            const tiny_model m = make_tiny_model(c);
            prefill          pf(m, prompt_tokens(48, c.n_vocab, 5), text_positions(48), 32, flash);
            const el::prefill_state state = pf.state();
            for (const char * method : { "pyramidkv+ecokv", "adakv+snapkv", "madakv" }) {
                SCOPED_TRACE(std::string(arch) + " " + method + (flash ? " FA" : " no FA"));
                el::compressed_cache cc = el::compress_context(m.get(), state, ecokv::parse_method(method),
                                                               budget(14, 4), 8, context_params(64, flash));
                std::set<size_t> counts;
                for (const auto & layer : cc.sel.layers) {
                    for (const auto & h : layer) {
                        counts.insert(h.kept.size());
                    }
                }
                if (std::string(method) != "madakv") {  // MadaKV may allocate evenly on a text prompt (qwen3vl's)
                    ASSERT_GT(counts.size(), 1u) << "expected different budgets per head";
                }
                if (std::string(method) == "pyramidkv+ecokv") {  // the pyramid over the compressed layers only
                    EXPECT_GT(cc.sel.layers.front()[0].kept.size(), cc.sel.layers.back()[0].kept.size());
                }
                EXPECT_EQ(el::kv_bytes_allocated(cc.ctx.get()),
                          ragged_bytes(cc.sel, 8, c.head_dim()) + sliding_bytes(m, cc.ctx.get()));
                expect_masked_reference(pf, cc.ctx.get(), cc.sel, { 9, 31, 64, 2, 17 }, 48);
            }
        }
    }
}

// LOOK-M's pivot merge rewrites kept rows: the ragged cache holds the rewritten rows (as F16), not the originals.
TEST(adapter, merged_rows_are_what_the_cache_holds) {
    const tiny_model m = make_tiny_model({});
    prefill          pf(m, prompt_tokens(40, m.config().n_vocab, 21), text_positions(40));
    const el::prefill_state st = pf.state();
    ecokv::method_params    p  = budget(12, 4);
    p.merge                    = ecokv::merge_kind::pivot;
    el::compressed_cache cc = el::compress_context(m.get(), st, ecokv::parse_method("lookm"), p, 4, context_params(32));
    const int32_t d       = m.config().head_dim();
    size_t        changed = 0;
    for (int32_t il = 0; il < m.config().n_layer; ++il) {
        for (const bool v : { false, true }) {
            const ggml_tensor * store = llama_kv_store(cc.ctx.get(), il, v);
            ASSERT_EQ(store->type, GGML_TYPE_F16);
            std::vector<ggml_fp16_t> host(size_t(ggml_nelements(store)));  // from a device too
            ggml_backend_tensor_get(const_cast<ggml_tensor *>(store), host.data(), 0, ggml_nbytes(store));
            const ggml_fp16_t * rows = host.data();
            size_t       row0 = 0;
            for (const auto & h : cc.sel.layers[il]) {
                const std::vector<float> & merged = v ? h.values : h.keys;
                ASSERT_EQ(merged.size(), h.kept.size() * d);
                for (size_t i = 0; i < merged.size(); ++i) {
                    EXPECT_EQ(rows[row0 * d + i], ggml_fp32_to_fp16(merged[i])) << "layer " << il << " row " << i / d;
                }
                const ecokv::tensor_view src = v ? st.view().layers[il].values : st.view().layers[il].keys;
                for (size_t i = 0; i < h.kept.size(); ++i) {
                    changed += std::memcmp(rows + (row0 + i) * d, src.row(h.kept[i], &h - cc.sel.layers[il].data()),
                                           d * sizeof(ggml_fp16_t)) != 0;
                }
                row0 += h.kept.size() + 1 + 4;
            }
        }
    }
    EXPECT_GT(changed, 0u) << "the merge rewrote no row: the test has no power";
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
    const el::prefill_state state = pf.state(pf.modality());
    EXPECT_EQ(state.n_past(), 20);
    el::compressed_cache cc = el::compress_context(m.get(), state, ecokv::parse_method("pyramidkv+ecokv"), budget(12, 4),
                                                   8, context_params(32));
    expect_masked_reference(pf, cc.ctx.get(), cc.sel, { 4, 8, 15 }, 20);  // the next text position is 20, not 28
}

TEST(adapter, capture_holds_the_cache_and_the_post_rope_queries) {
    for (const char * arch : { "llama", "qwen2vl" }) {
        SCOPED_TRACE(arch);
        tiny_config c;
        c.arch                  = arch;
        const tiny_model m      = make_tiny_model(c);
        prefill          pf(m, prompt_tokens(40, c.n_vocab, 13), text_positions(40), 32);
        const el::prefill_state     state = pf.state();
        const ecokv::capture_view & v     = state.view();
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
