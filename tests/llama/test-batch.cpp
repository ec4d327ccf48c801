// Many sequences in one context (ecokv/llama-batch.h, issue 50): full, uniform and per-head (AdaKV) caches decoding
// together give the greedy tokens and logits of each decoded alone in its own context, and of the plain C++
// reference forward with what each head kept; sequences enter and leave between steps; admission is by memory,
// counted by hand; a released snapshot resumes in a usual context.
#include "ecokv/error.h"
#include "ecokv/llama-batch.h"
#include "ecokv/llama-session.h"
#include "session-test-util.h"
#include "tiny-model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

namespace {

using namespace ecokv::test;
namespace el = ecokv::llama;

el::session_options options(llama_flash_attn_type fa = LLAMA_FLASH_ATTN_TYPE_AUTO, ggml_type kv = GGML_TYPE_F16) {
    el::session_options o;
    o.n_threads  = 2;
    o.flash_attn = fa;
    o.type_k = o.type_v = kv;
    return o;
}

ecokv::method_requirements window32() {
    ecokv::method_requirements r;
    r.n_window_queries = 32;
    r.values           = true;
    return r;
}

// A prompt's sequence: its tokens, its snapshot (full or compressed with `method` at budget 12) and what each head kept.
struct source {
    std::vector<int32_t>              tokens;
    el::snapshot                      snap;
    std::vector<std::vector<int32_t>> kept;
};

source make_source(const el::session & s, const tiny_model & m, int32_t n, uint32_t seed, const char * method) {
    source out{ prompt_tokens(n, m.config().n_vocab, seed), {}, {} };
    el::sequence full = s.prefill(s.make_prompt(out.tokens), 16, window32());
    if (method == nullptr) {
        out.snap = full.save();
        return out;
    }
    el::sequence c = full.compress(ecokv::parse_method(method), budget(12, 4), 16);
    out.kept       = c.kept_cells();
    out.snap       = c.save();
    return out;
}

// n greedy steps of one sequence alone (a usual context resumed from its snapshot): each step's logits, then tokens.
struct path {
    std::vector<llama_token>        tokens;
    std::vector<std::vector<float>> logits;  // before each token is picked
};

path alone(const el::session & s, const el::snapshot & snap, int32_t n) {
    el::sequence seq = s.resume(snap, ecokv::compression::none(), 16);
    path         p;
    for (int32_t i = 0; i < n; ++i) {
        p.logits.push_back(seq.logits());
        p.tokens.push_back(el::argmax(seq.logits()));
        seq.decode({ p.tokens.back() });
    }
    p.logits.push_back(seq.logits());
    return p;
}

struct fixture {
    tiny_model  m;
    el::session s;
    explicit fixture(const el::session_options & o = options(), const tiny_config & c = {})
        : m(make_tiny_model(c)), s(*m.get(), o) {}
};

void expect_batched_equals_alone(const el::session_options & o, const tiny_config & c = {}) {
    const fixture               f(o, c);
    const std::vector<source>   src = { make_source(f.s, f.m, 30, 1, nullptr), make_source(f.s, f.m, 40, 2, "snapkv+ecokv"),
                                        make_source(f.s, f.m, 36, 3, "adakv") };
    const auto & ada = src[2].snap.layout;
    ASSERT_NE(std::adjacent_find(ada.begin(), ada.end(), std::not_equal_to<>()), ada.end())
        << "AdaKV should give the heads different budgets";
    const int32_t n_steps = 6;
    std::vector<path> want;
    for (const source & x : src) {
        want.push_back(alone(f.s, x.snap, n_steps));
    }
    el::batch b(f.s, { 256, 40, 4 });
    std::vector<int32_t> seat;
    for (const source & x : src) {
        seat.push_back(b.admit(x.snap, n_steps + 2));
    }
    for (int32_t step = 0; step <= n_steps; ++step) {
        std::vector<std::pair<int32_t, std::vector<llama_token>>> work;
        for (size_t i = 0; i < src.size(); ++i) {
            EXPECT_LT(rel_diff(b.logits(seat[i]), want[i].logits[size_t(step)]), logit_rel_tolerance)
                << "sequence " << i << " step " << step;
            if (step < n_steps) {
                const llama_token t = el::argmax(b.logits(seat[i]));
                EXPECT_EQ(t, want[i].tokens[size_t(step)]) << "sequence " << i << " step " << step;
                work.push_back({ seat[i], { t } });
            }
        }
        if (!work.empty()) {
            b.step(work);
        }
    }
    // Independently of the alone path: the last logits against the reference forward with what each head kept.
    for (size_t i = 0; i < src.size(); ++i) {
        std::vector<int32_t> all = src[i].tokens;
        all.insert(all.end(), want[i].tokens.begin(), want[i].tokens.end());
        const auto positions = text_positions(int32_t(all.size()));
        const kv_rounding stored = cache_rounding(o.type_k, o.type_v);
        const keep_fn     keep   = src[i].kept.empty() ? keep_fn{}
                                                       : kept_mask(src[i].kept, c.n_head_kv, int32_t(src[i].tokens.size()), &f.m);
        const auto        ref    = reference_logits(f.m, all, positions, keep, stored);
        // The reference rounds a quantized cache and its queries as the CPU does; a device dequantizes and converts
        // the queries its own way (3.5-4.8e-3 on lavapipe, for the full cache as for the compressed ones).
        const bool   device    = tiny_config::test_gpu_layers() != 0 && el::gpu_offload_supported();
        const double tolerance = device && ggml_is_quantized(o.type_k) ? 1e-2 : logit_rel_tolerance;
        EXPECT_LT(rel_diff(b.logits(seat[i]), ref), tolerance) << "sequence " << i;
    }
}

TEST(batch, full_uniform_and_per_head_caches_decode_together_as_alone) {
    expect_batched_equals_alone(options());
    tiny_config mrope;  // Qwen2-VL's text model: M-RoPE positions, Q/K/V biases
    mrope.arch = "qwen2vl";
    expect_batched_equals_alone(options(), mrope);
}

// An iSWA model (gemma3: sliding-window layers of 8 positions between global ones) decodes in a batch as alone.
TEST(batch, an_iswa_model_decodes_together_as_alone) {
    tiny_config gemma;
    gemma.arch    = "gemma3";
    gemma.n_layer = 4;  // global layers 1 and 3
    expect_batched_equals_alone(options(), gemma);
}

TEST(batch, without_flash_attention_and_with_a_quantized_cache_too) {
    // Without flash attention a full snapshot's V is transposed, which a pool does not take: compressed ones only.
    const fixture f(options(LLAMA_FLASH_ATTN_TYPE_DISABLED));
    const source  a = make_source(f.s, f.m, 40, 4, "adakv"), full = make_source(f.s, f.m, 30, 5, nullptr);
    const path    want = alone(f.s, a.snap, 4);
    el::batch     b(f.s, { 256, 40, 4 });
    EXPECT_THROW(b.admit(full.snap, 4), ecokv::error);
    EXPECT_EQ(b.n_live(), 0);
    EXPECT_EQ(b.cells_promised(), 0);
    const int32_t i = b.admit(a.snap, 4);
    for (int32_t step = 0; step < 4; ++step) {
        EXPECT_LT(rel_diff(b.logits(i), want.logits[size_t(step)]), logit_rel_tolerance) << "step " << step;
        b.step({ { i, { want.tokens[size_t(step)] } } });
    }
    EXPECT_LT(rel_diff(b.logits(i), want.logits[4]), logit_rel_tolerance);
    tiny_config wide;  // q8_0 blocks of 32 elements: heads of 32
    wide.n_embd = 128;
    expect_batched_equals_alone(options(LLAMA_FLASH_ATTN_TYPE_ENABLED, GGML_TYPE_Q8_0), wide);
}

// A sequence prefilled chunk by chunk (compressed after every chunk, AdaKV's per-head budgets) decodes in a batch
// beside a full one as each does alone.
TEST(batch, a_chunked_prefill_decodes_in_a_batch_as_alone) {
    const fixture      f;
    ecokv::compression c;
    c.spec   = ecokv::parse_method("adakv");
    c.params = budget(12, 4);
    c.chunk  = 16;
    const auto         tokens = prompt_tokens(50, f.m.config().n_vocab, 12);
    const el::snapshot chunked = f.s.prefill(f.s.make_prompt(tokens), c, 16).save();
    const source       full    = make_source(f.s, f.m, 30, 13, nullptr);
    const path         wc = alone(f.s, chunked, 5), wf = alone(f.s, full.snap, 5);
    el::batch          b(f.s, { 256, 40, 2 });
    const int32_t      ic = b.admit(chunked, 8), jf = b.admit(full.snap, 8);
    for (int32_t step = 0; step < 5; ++step) {
        EXPECT_LT(rel_diff(b.logits(ic), wc.logits[size_t(step)]), logit_rel_tolerance) << "step " << step;
        EXPECT_LT(rel_diff(b.logits(jf), wf.logits[size_t(step)]), logit_rel_tolerance) << "step " << step;
        b.step({ { ic, { wc.tokens[size_t(step)] } }, { jf, { wf.tokens[size_t(step)] } } });
    }
    EXPECT_LT(rel_diff(b.logits(ic), wc.logits[5]), logit_rel_tolerance);
}

// Sequences enter and leave between steps; a released one resumes in a usual context where it left off, and the one
// admitted after it takes its kept rows.
TEST(batch, sequences_come_and_go_between_steps) {
    const fixture f;
    const source  a = make_source(f.s, f.m, 40, 6, "adakv"), c = make_source(f.s, f.m, 33, 7, "snapkv+ecokv");
    const source  d = make_source(f.s, f.m, 25, 8, nullptr);
    const path    wa = alone(f.s, a.snap, 6), wc = alone(f.s, c.snap, 4), wd = alone(f.s, d.snap, 3);
    el::batch     b(f.s, { 128, 24, 2 });
    const int32_t ia = b.admit(a.snap, 8);
    b.step({ { ia, { wa.tokens[0] } } });
    b.step({ { ia, { wa.tokens[1] } } });
    const int32_t ic = b.admit(c.snap, 6);
    EXPECT_FALSE(b.fits(d.snap, 3)) << "two seats at most";
    b.step({ { ic, { wc.tokens[0] } }, { ia, { wa.tokens[2] } } });
    b.step({ { ia, { wa.tokens[3] } }, { ic, { wc.tokens[1] } } });
    EXPECT_LT(rel_diff(b.logits(ia), wa.logits[4]), logit_rel_tolerance);
    EXPECT_LT(rel_diff(b.logits(ic), wc.logits[2]), logit_rel_tolerance);

    el::snapshot later = b.release(ia);
    EXPECT_EQ(later.n_past, a.snap.n_past + 4);
    EXPECT_EQ(later.n_cells, a.snap.n_cells + 4);
    EXPECT_EQ(later.layout, a.snap.layout);
    el::sequence resumed = f.s.resume(later, ecokv::compression::none(), 4);
    resumed.decode({ wa.tokens[4] });
    EXPECT_LT(rel_diff(resumed.logits(), wa.logits[5]), logit_rel_tolerance);

    const int32_t id = b.admit(d.snap, 3);  // the full cache takes cells only
    b.step({ { id, { wd.tokens[0] } }, { ic, { wc.tokens[2] } } });
    b.step({ { ic, { wc.tokens[3] } }, { id, { wd.tokens[1] } } });
    EXPECT_LT(rel_diff(b.logits(ic), wc.logits[4]), logit_rel_tolerance);
    EXPECT_LT(rel_diff(b.logits(id), wd.logits[2]), logit_rel_tolerance);
    const el::snapshot dl = b.release(id);  // a full cache leaves in the usual format: a usual context takes it
    el::sequence       dr = f.s.resume(dl, ecokv::compression::none(), 4);
    dr.decode({ wd.tokens[2] });
    EXPECT_LT(rel_diff(dr.logits(), wd.logits[3]), logit_rel_tolerance);
}

// Admission counts cells and kept rows: by hand here.
TEST(batch, admission_is_by_memory) {
    const fixture f;
    const source  a = make_source(f.s, f.m, 40, 9, "adakv"), u = make_source(f.s, f.m, 40, 10, "snapkv+ecokv");
    const source  full = make_source(f.s, f.m, 30, 11, nullptr);
    const uint32_t widest = *std::max_element(a.snap.layout.begin(), a.snap.layout.end());
    ASSERT_GT(widest, 12u);
    // A compressed snapshot holds its label cell; a full one its 30 prompt cells.
    EXPECT_EQ(a.snap.n_cells, 1);
    EXPECT_EQ(full.snap.n_cells, 30);
    {
        el::batch b(f.s, { 64, int32_t(widest) - 1, 8 });
        EXPECT_FALSE(b.fits(a.snap, 4)) << "its widest head does not fit";
        EXPECT_TRUE(b.fits(u.snap, 4));
        EXPECT_THROW(b.admit(a.snap, 4), ecokv::error);
    }
    el::batch b(f.s, { 64, 24, 8 });
    ASSERT_EQ(b.n_cells(), 256) << "llama.cpp rounds a context up to 256 cells";
    EXPECT_TRUE(b.fits(full.snap, 226));
    EXPECT_FALSE(b.fits(full.snap, 227)) << "30 + 227 cells > 256";
    const int32_t i = b.admit(full.snap, 200);
    EXPECT_EQ(b.cells_promised(), 230);
    EXPECT_TRUE(b.fits(u.snap, 25));   // 230 + 1 + 25 = 256
    EXPECT_FALSE(b.fits(u.snap, 26));
    const int32_t j = b.admit(u.snap, 25);
    EXPECT_EQ(b.kept_rows_used(), 12);
    EXPECT_FALSE(b.fits(u.snap, 0)) << "12 + 12 kept rows fit, but no cell is left for its label";
    EXPECT_THROW(b.step({ { j, std::vector<llama_token>(26, 1) } }), ecokv::error) << "more than admitted with";
    EXPECT_THROW(b.step({ { 5, { 1 } } }), ecokv::error) << "no sequence there";
    EXPECT_THROW(b.step({ { i, { 1 } }, { i, { 2 } } }), ecokv::error) << "a seat twice";
    b.drop(i);
    EXPECT_EQ(b.cells_promised(), 26);
    EXPECT_TRUE(b.fits(u.snap, 4));
    b.admit(u.snap, 4);
    EXPECT_EQ(b.kept_rows_used(), 24);
    // K and V of 2 layers x 2 KV heads x (24 kept + 256 cells) rows of 16 F16 elements.
    EXPECT_EQ(b.kv_bytes_allocated(), uint64_t(2 * 2 * (24 + 256)) * 16 * 2 * 2);
}

}  // namespace
