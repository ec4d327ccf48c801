// Quantized KV caches under eviction (-ctk/-ctv q8_0, q4_0, ...): the ragged cache keeps the type, its rows copied
// as whole blocks, and attends over exactly the quantized entries it kept. Checked against llama.cpp's own
// quantized cache (a covering budget) and against the reference forward of tiny-model.cpp reading the same
// quantized entries (cache_rounding), with the kept entries' masks, for uniform and ragged allocators, one-shot and
// chunked; the bytes allocated against a count by hand.
#include "ecokv/error.h"
#include "ecokv/llama-session.h"
#include "session-test-util.h"
#include "tiny-model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

namespace {

using namespace ecokv::test;
namespace el = ecokv::llama;

// head_dim 32: whole blocks of every quantized type (32 elements each).
tiny_config config(const std::string & arch) {
    tiny_config c;
    c.arch          = arch;
    c.n_embd        = 128;
    c.n_ff          = 192;
    c.rope_sections = { 4, 6, 6, 0 };
    return c;
}

struct cache_types {
    ggml_type k, v;
};

std::string name(cache_types t) { return std::string(ggml_type_name(t.k)) + "/" + ggml_type_name(t.v); }

el::session_options options(cache_types t) {
    el::session_options o;
    o.n_threads  = 2;
    o.type_k     = t.k;
    o.type_v     = t.v;
    o.flash_attn = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    return o;
}


// A file removed at the end of the test.
struct temp_file {
    std::string path;
    ~temp_file() { std::filesystem::remove(path); }
};

// SparseMM head scores ({"layer-head": [score, ...]}) that differ between heads.
temp_file sparsemm_scores(int32_t n_layers, int32_t n_heads) {
    temp_file f{ (std::filesystem::temp_directory_path() /
                  ("ecokv-test-quantized-kv-" + std::to_string(::getpid()) + ".json")).string() };
    std::ofstream out(f.path);
    out << "{";
    for (int32_t l = 0; l < n_layers; ++l) {
        for (int32_t h = 0; h < n_heads; ++h) {
            out << (l + h ? "," : "") << "\"" << l << "-" << h << "\": [" << 0.1 + 0.3 * ((l * 5 + h * 3) % 4) << "]";
        }
    }
    out << "}";
    return f;
}

class quantized_kv : public ::testing::TestWithParam<const char *> {};

const cache_types k_types[] = { { GGML_TYPE_Q8_0, GGML_TYPE_Q8_0 },
                                { GGML_TYPE_Q4_0, GGML_TYPE_Q4_0 },
                                { GGML_TYPE_Q8_0, GGML_TYPE_F16 } };

// A budget covering the prompt answers as llama.cpp's own quantized cache does.
TEST_P(quantized_kv, a_covering_budget_answers_as_llamas_quantized_cache) {
    const tiny_model m = make_tiny_model(config(GetParam()));
    const auto       tokens = prompt_tokens(40, m.config().n_vocab, 31);
    for (const cache_types t : k_types) {
        const el::session s(*m.get(), options(t));
        el::sequence      full  = s.prefill(s.make_prompt(tokens), 8, ecokv::requirements(ecokv::parse_method("snapkv"), budget(64, 8)));
        el::sequence      cover = full.compress(ecokv::parse_method("snapkv"), budget(64, 8), 8);
        EXPECT_EQ(cover.n_cells(), 40);
        const auto want = full.answer({ 3, 4 }, 6, true);
        const auto got  = cover.answer({ 3, 4 }, 6, true);
        EXPECT_EQ(got.tokens, want.tokens) << name(t);
        for (size_t i = 0; i < want.logits.size(); ++i) {
            EXPECT_LT(rel_diff(got.logits[i], want.logits[i]), 1e-5) << name(t) << " step " << i;
        }
    }
}

// Evicting per head: the logits are the reference's reading the same quantized entries, masked by what each head
// kept. With K and V quantized, CPU flash attention accumulates in F32 and the match is to 1e-5 (measured 1.5e-7 ..
// 2.8e-7); an F16 V is accumulated in F16 (logit_rel_tolerance; measured 1.5e-3 .. 2.6e-3). The reference without the
// rounding is 5e-3 .. 2e-1 off (the test sees the quantization), and the evictions show.
TEST_P(quantized_kv, the_ragged_cache_reads_the_quantized_entries_it_kept) {
    const tiny_model m      = make_tiny_model(config(GetParam()));
    const int32_t    n      = 48;
    const auto       tokens = prompt_tokens(n, m.config().n_vocab, 32);
    auto             next   = tokens;
    next.push_back(9);
    for (const cache_types t : k_types) {
        const el::session  s(*m.get(), options(t));
        const kv_rounding  stored = cache_rounding(t.k, t.v);
        const el::sequence full   = s.prefill(s.make_prompt(tokens), 8, ecokv::requirements(ecokv::parse_method("snapkv"), budget(16, 4)));
        for (const char * method : { "snapkv+ecokv", "pyramidkv+knorm", "adakv+ecokv", "madakv+snapkv" }) {
            el::sequence small = full.compress(ecokv::parse_method(method), budget(16, 4), 8);
            const auto   kept  = small.kept_cells();
            small.decode({ 9 });
            const keep_fn see = kept_mask(kept, 2, n);
            EXPECT_LT(rel_diff(small.logits(), reference_logits(m, next, text_positions(n + 1), see, stored)),
                      ggml_is_quantized(t.v) ? 1e-5 : logit_rel_tolerance)
                << name(t) << " " << method;
            EXPECT_GT(rel_diff(small.logits(), reference_logits(m, next, text_positions(n + 1), {}, stored)),
                      3 * logit_rel_tolerance) << name(t) << " " << method << ": the evictions should show";
            EXPECT_GT(rel_diff(small.logits(), reference_logits(m, next, text_positions(n + 1), see)), 3e-3)
                << name(t) << " " << method << ": the quantization should show";
        }
    }
}

INSTANTIATE_TEST_SUITE_P(archs, quantized_kv, ::testing::Values("llama", "qwen2vl"));

// A q8_0 row of 32 elements is 34 bytes (an F16 scale and 32 int8), a q4_0 row 18 (an F16 scale and 16 bytes of
// nibbles): per (layer, KV head), kept + label + room rows of K and of V.
TEST(quantized_kv_memory, allocated_bytes_are_the_types_rows) {
    const temp_file  head_scores = sparsemm_scores(2, 4);
    const tiny_model m      = make_tiny_model(config("llama"));
    const auto       tokens = prompt_tokens(200, m.config().n_vocab, 33);
    for (const auto & [t, row] : { std::pair{ cache_types{ GGML_TYPE_Q8_0, GGML_TYPE_Q8_0 }, 34u + 34u },
                                   std::pair{ cache_types{ GGML_TYPE_Q4_0, GGML_TYPE_Q4_0 }, 18u + 18u },
                                   std::pair{ cache_types{ GGML_TYPE_Q8_0, GGML_TYPE_Q4_0 }, 34u + 18u } }) {
        const el::session  s(*m.get(), options(t));
        const el::sequence full = s.prefill(s.make_prompt(tokens), 8, ecokv::requirements(ecokv::parse_method("lookm"), budget(64, 8)));
        EXPECT_EQ(full.kv_bytes_per_cell(), 2u * 2 * row) << name(t);
        for (const char * method : { "snapkv", "pyramidkv+snapkv", "adakv+snapkv", "sparsemm+snapkv", "madakv+snapkv",
                                     "lookm" }) {
            ecokv::method_params p = budget(64, 8);
            p.head_scores          = head_scores.path;
            const el::sequence small = full.compress(ecokv::parse_method(method), p, 8);
            uint64_t           rows = 0, kept = 0;
            for (const auto & h : small.kept_cells()) {
                rows += h.size() + 1 + 8;
                kept += h.size();
            }
            EXPECT_EQ(small.kv_bytes_allocated(), rows * row) << name(t) << " " << method;
            EXPECT_EQ(small.kv_bytes_kept(), kept * row) << name(t) << " " << method;
            EXPECT_LE(double(small.kv_bytes_allocated()), 1.05 * double((kept + 4 * 8) * row)) << method;
        }
    }
}

// Chunked prefill on a q8_0 cache: after the last chunk, decoding sees what the last compression kept, read as
// stored; a snapshot of it resumes in a new context with the same answer.
TEST(quantized_kv_memory, chunked_prefill_and_snapshots_keep_the_type) {
    const tiny_model   m      = make_tiny_model(config("qwen2vl"));
    const cache_types  t      = { GGML_TYPE_Q8_0, GGML_TYPE_Q8_0 };
    const el::session  s(*m.get(), options(t));
    const auto         tokens = prompt_tokens(300, m.config().n_vocab, 34);
    const auto         spec   = ecokv::parse_method("adakv+ecokv");
    ecokv::compression c      = { true, spec, budget(24, 4) };
    c.chunk                   = 64;
    el::sequence       seq    = s.prefill(s.make_prompt(tokens), c, 8);
    EXPECT_EQ(seq.peak_kv_cells(), 256);
    const el::snapshot snap = seq.save();
    auto               want = seq.answer({ 7, 8 }, 5, true);
    el::sequence       moved = s.resume(snap, ecokv::compression::none(), 8);
    const auto         got   = moved.answer({ 7, 8 }, 5, true);
    EXPECT_EQ(got.tokens, want.tokens);
    for (size_t i = 0; i < want.logits.size(); ++i) {
        EXPECT_LT(rel_diff(got.logits[i], want.logits[i]), 1e-6) << "step " << i;
    }
    EXPECT_EQ(moved.kv_bytes_allocated(), seq.kv_bytes_allocated());
}

TEST(quantized_kv_errors, llamas_rules_are_clear_errors) {
    const tiny_model m = make_tiny_model(config("llama"));
    el::session_options o = options({ GGML_TYPE_Q8_0, GGML_TYPE_Q8_0 });
    o.flash_attn          = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    try {
        const el::session s(*m.get(), o);
        FAIL() << "a quantized V without flash attention was accepted";
    } catch (const ecokv::error & e) {
        EXPECT_STREQ(e.what(), "--cache-type-v q8_0: a quantized V cache needs flash attention (-fa on or auto), as in llama.cpp");
    }
    o.type_v = GGML_TYPE_F16;  // a quantized K is fine without flash attention
    EXPECT_NO_THROW(el::session(*m.get(), o));
    const tiny_model small = make_tiny_model({});  // head_dim 16
    try {
        const el::session s(*small.get(), options({ GGML_TYPE_Q4_0, GGML_TYPE_F16 }));
        FAIL() << "rows of 16 elements were taken as q4_0 blocks";
    } catch (const ecokv::error & e) {
        EXPECT_STREQ(e.what(), "--cache-type-k q4_0 stores blocks of 32 elements; this model's K heads have 16 (use f16, "
                               "f32 or bf16)");
    }
}

}  // namespace
