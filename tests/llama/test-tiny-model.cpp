// Validates tests/llama/tiny-model.{h,cpp}: the plain-C++ reference forward pass reproduces llama.cpp's logits and KV
// cache for random-weight llama, qwen2, qwen2vl, qwen3vl and gemma3 models (image blocks, deepstack inputs, sliding
// windows), and its keep mask, positions, planes and inputs really change the result.
#include "tiny-model.h"

#include "ggml.h"
#include "llama.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace t = ecokv::test;

namespace {

// ---- tolerances ------------------------------------------------------------------------------------------------
// Logits: t::logit_rel_tolerance (3e-3 of max |ref|), justified in tiny-model.h. Measured here: 4e-4 .. 8e-4 (gemma3
// 1e-4 .. 3e-4); over 40 seeds x {llama, qwen2vl} x FA on/off the worst was 1.0e-3, over 40 seeds x {qwen3vl image +
// deepstack, gemma3 24 tokens / window 8} x FA on/off with 2-4 layers 8.1e-4. The sensitivity checks below demand
// effects of 0.02-0.1, or more than 3x the tolerance.
constexpr double k_logit_rel_tol = t::logit_rel_tolerance;
// Layer-0 K/V are one F16 rounding of a value computed in F32: |diff| <= 2^-11 |x| + F32 noise.
constexpr double k_kv0_rel = 1.0 / 1024, k_kv0_abs = 1e-4;
// Deeper layers also inherit the F16 rounding of earlier layers' attention.
constexpr double k_kv_rel = 4e-3, k_kv_abs = 2e-3;

void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

struct quiet_env : ::testing::Environment {
    void SetUp() override { llama_log_set(quiet_log, nullptr); }
};

[[maybe_unused]] ::testing::Environment * const g_env = ::testing::AddGlobalTestEnvironment(new quiet_env);

struct ctx_deleter {
    void operator()(llama_context * c) const { llama_free(c); }
};

using ctx_ptr = std::unique_ptr<llama_context, ctx_deleter>;

ctx_ptr make_ctx(const t::tiny_model & m, llama_flash_attn_type fa = LLAMA_FLASH_ATTN_TYPE_AUTO) {
    llama_context_params p = llama_context_default_params();  // n_ctx 512, F16 K/V cache
    p.n_threads            = 4;
    p.n_threads_batch      = 4;
    p.flash_attn_type      = fa;
    ctx_ptr c(llama_init_from_model(m.get(), p));
    if (!c) {
        throw std::runtime_error("llama_init_from_model failed");
    }
    return c;
}

std::vector<float> last_logits(llama_context * ctx, const t::tiny_model & m) {
    const float * l = llama_get_logits_ith(ctx, -1);
    if (!l) {
        throw std::runtime_error("no logits");
    }
    return std::vector<float>(l, l + m.config().n_vocab);
}

std::vector<int32_t> prompt_tokens(int32_t n, int32_t n_vocab, int32_t salt = 0) {
    std::vector<int32_t> tok(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
        tok[size_t(i)] = int32_t((7 * i * i + 3 * i + 11 + 13 * salt) % n_vocab);
    }
    return tok;
}

struct diff_stats {
    double max_abs = 0, ref_max = 0;

    double rel() const { return max_abs / std::max(ref_max, 1e-30); }
};

diff_stats compare(const std::vector<float> & got, const std::vector<float> & ref) {
    EXPECT_EQ(got.size(), ref.size());
    diff_stats s;
    for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
        s.max_abs = std::max(s.max_abs, std::fabs(double(got[i]) - double(ref[i])));
        s.ref_max = std::max(s.ref_max, std::fabs(double(ref[i])));
    }
    return s;
}

size_t argmax(const std::vector<float> & v) {
    return size_t(std::max_element(v.begin(), v.end()) - v.begin());
}

// ---- state blob (llama_state_seq_get_data) ---------------------------------------------------------------------
// u32 magic, i32 seq_id, then one section per KV cache (a plain cache; gemma3's iSWA cache writes its base cache of
// global layers, then its SWA cache): u32 n_stream, u32 cell_count, cells {i32 pos, u32 n_seq, [ext i32 x, y, tok],
// i32 seq...}, u32 v_trans, u32 n_layer, per layer {i32 k_type, u64 row_bytes, rows}, then V as rows or (v_trans) per
// layer {i32 type, u32 el_bytes, u32 n_embd_v, n_embd_v x cell_count elements}. A SWA cache writes only the cells
// inside the window of the sequence's last position. See adapters/llama/state-blob.h.
struct blob_section {
    int32_t                             n_cells = 0;
    bool                                v_trans = false;
    std::vector<int32_t>                pos;
    std::vector<std::array<int32_t, 3>> ext;   // x, y, tok
    std::vector<std::vector<float>>     k, v;  // [layer of this cache][cell * n_embd_gqa + e]
};

struct blob_view {
    std::vector<blob_section> sections;

    // The section holding model layer il, and the layer's index in it: iSWA's base cache holds the global layers in
    // order, its SWA cache the SWA layers.
    std::pair<const blob_section *, size_t> layer(const t::tiny_model & m, int32_t il) const {
        if (sections.size() == 1) {
            return { &sections[0], size_t(il) };
        }
        size_t idx = 0;
        for (int32_t l = 0; l < il; ++l) {
            idx += m.is_swa(l) == m.is_swa(il) ? 1 : 0;
        }
        return { &sections.at(m.is_swa(il) ? 1 : 0), idx };
    }
};

struct reader {
    const std::vector<uint8_t> & b;
    size_t                       off = 0;

    template <typename T> T get() {
        if (off + sizeof(T) > b.size()) {
            throw std::runtime_error("blob truncated");
        }
        T v;
        std::memcpy(&v, b.data() + off, sizeof(T));
        off += sizeof(T);
        return v;
    }

    float f16() { return ggml_fp16_to_fp32(get<ggml_fp16_t>()); }
};

blob_section parse_section(reader & r, bool has_ext, int32_t n_embd_gqa) {
    blob_section out;
    if (r.get<uint32_t>() != 1) {
        throw std::runtime_error("expected one stream");
    }
    out.n_cells = int32_t(r.get<uint32_t>());
    for (int32_t i = 0; i < out.n_cells; ++i) {
        out.pos.push_back(r.get<int32_t>());
        const uint32_t n_seq = r.get<uint32_t>();
        std::array<int32_t, 3> e{ 0, 0, -1 };
        if (has_ext) {
            e[0] = r.get<int32_t>();
            e[1] = r.get<int32_t>();
            e[2] = r.get<int32_t>();
        }
        out.ext.push_back(e);
        for (uint32_t s = 0; s < n_seq; ++s) {
            r.get<int32_t>();
        }
    }
    out.v_trans             = r.get<uint32_t>() != 0;
    const uint32_t n_layer  = r.get<uint32_t>();
    const size_t   n_values = size_t(out.n_cells) * size_t(n_embd_gqa);
    for (uint32_t il = 0; il < n_layer; ++il) {
        if (r.get<int32_t>() != GGML_TYPE_F16 || r.get<uint64_t>() != uint64_t(n_embd_gqa) * 2) {
            throw std::runtime_error("unexpected K type/row size");
        }
        std::vector<float> k(n_values);
        for (float & x : k) {
            x = r.f16();
        }
        out.k.push_back(std::move(k));
    }
    for (uint32_t il = 0; il < n_layer; ++il) {
        if (r.get<int32_t>() != GGML_TYPE_F16) {
            throw std::runtime_error("unexpected V type");
        }
        std::vector<float> v(n_values);
        if (!out.v_trans) {
            if (r.get<uint64_t>() != uint64_t(n_embd_gqa) * 2) {
                throw std::runtime_error("unexpected V row size");
            }
            for (float & x : v) {
                x = r.f16();
            }
        } else {
            if (r.get<uint32_t>() != 2 || r.get<uint32_t>() != uint32_t(n_embd_gqa)) {
                throw std::runtime_error("unexpected transposed V header");
            }
            for (int32_t e = 0; e < n_embd_gqa; ++e) {
                for (int32_t c = 0; c < out.n_cells; ++c) {
                    v[size_t(c) * size_t(n_embd_gqa) + size_t(e)] = r.f16();
                }
            }
        }
        out.v.push_back(std::move(v));
    }
    return out;
}

blob_view parse_blob(const std::vector<uint8_t> & bytes, bool has_ext, int32_t n_embd_gqa) {
    reader    r{ bytes };
    blob_view out;
    if (r.get<uint32_t>() != 0xaf143cd8u) {
        throw std::runtime_error("bad magic");
    }
    r.get<int32_t>();  // seq_id
    while (r.off < bytes.size()) {
        out.sections.push_back(parse_section(r, has_ext, n_embd_gqa));
    }
    return out;
}

std::vector<uint8_t> get_blob(llama_context * ctx) {
    std::vector<uint8_t> b(llama_state_seq_get_size(ctx, 0));
    const size_t         n = llama_state_seq_get_data(ctx, b.data(), b.size(), 0);
    b.resize(n);
    return b;
}

t::tiny_config config_for(const std::string & arch) {
    t::tiny_config c;
    c.arch = arch;
    if (arch == "qwen3vl") {
        c.n_deepstack_layers = 1;  // n_embd_inp 128; text inputs are zero-padded, so it adds nothing here
    }
    if (arch == "gemma3") {
        c.rope_freq_base = 1e6f;  // global layers; SWA layers (even: 0, 2, ...) use rope_freq_base_swa 1e4, window 8
    }
    return c;
}

// Prompt of 20 text tokens.
struct prompt {
    std::vector<int32_t>     tokens;
    std::vector<t::position> positions;
    std::vector<bool>        image;  // fed as embeddings (ext.tok = -1 in the cache)
};

prompt text_prompt(const t::tiny_model & m, int32_t n = 20) {
    return { prompt_tokens(n, m.config().n_vocab), t::text_positions(n), std::vector<bool>(size_t(n), false) };
}

// 5 text tokens, a 4x3 "image" at t = 5 (12 tokens sharing t, y/x raster), then 5 text tokens from t = 5 + 4.
prompt image_prompt(const t::tiny_model & m) {
    prompt p;
    p.tokens    = prompt_tokens(22, m.config().n_vocab, 1);
    p.positions = t::text_positions(5, 0);
    const auto img = t::image_positions(5, 4, 3);
    p.positions.insert(p.positions.end(), img.begin(), img.end());
    const auto tail = t::text_positions(5, 9);
    p.positions.insert(p.positions.end(), tail.begin(), tail.end());
    p.image.assign(22, false);
    std::fill(p.image.begin() + 5, p.image.begin() + 17, true);
    return p;
}

class TinyModel : public ::testing::TestWithParam<std::string> {};

// ---- the model itself ------------------------------------------------------------------------------------------

TEST_P(TinyModel, OptionalTensorsAreNeutral) {
    const t::tiny_model m = t::make_tiny_model(config_for(GetParam()));
    ASSERT_NE(m.get(), nullptr);
    std::string optional;
    for (const auto & [name, tt] : m.tensors()) {
        const bool scale = name.ends_with(".scale") || name.ends_with(".input_scale") || name.starts_with("rope_freqs");
        const bool qkv_bias = name.ends_with("attn_q.bias") || name.ends_with("attn_k.bias") ||
                              name.ends_with("attn_v.bias");
        const bool random_bias = qkv_bias && (GetParam() == "qwen2" || GetParam() == "qwen2vl");
        const bool bias        = name.ends_with(".bias") && !random_bias;
        const bool unused      = name == "cls.output.weight";  // qwen3vl's rerank head
        if (scale || bias || unused) {
            optional += " " + name;
            const float want = scale ? 1.0f : 0.0f;
            for (float x : tt.data) {
                ASSERT_EQ(x, want) << name;
            }
        }
    }
    std::printf("[%s] %zu tensors; neutral optional ones:%s\n", GetParam().c_str(), m.tensors().size(),
                optional.c_str());
    EXPECT_TRUE(m.find("output.weight"));
    if (GetParam() != "llama") {
        EXPECT_TRUE(m.find("blk.0.attn_k.bias"));
    }
}

TEST_P(TinyModel, DeterministicAndMovable) {
    t::tiny_config c = config_for(GetParam());
    t::tiny_model  a = t::make_tiny_model(c);
    t::tiny_model  b = t::make_tiny_model(c);
    EXPECT_EQ(a.tensor("blk.1.attn_q.weight").data, b.tensor("blk.1.attn_q.weight").data);
    c.seed           = 2;
    t::tiny_model d  = t::make_tiny_model(c);
    EXPECT_NE(a.tensor("blk.1.attn_q.weight").data, d.tensor("blk.1.attn_q.weight").data);

    llama_model * raw = a.get();
    t::tiny_model moved(std::move(a));
    EXPECT_EQ(moved.get(), raw);
    EXPECT_EQ(a.get(), nullptr);  // NOLINT(bugprone-use-after-move): checking the moved-from state
    b = std::move(moved);
    EXPECT_EQ(b.get(), raw);
}

// ---- reference vs llama.cpp -------------------------------------------------------------------------------------

void expect_logits_match(const t::tiny_model & m, const prompt & p, const char * what) {
    ctx_ptr ctx = make_ctx(m);
    ASSERT_EQ(t::decode_prompt(ctx.get(), m, p.tokens, p.positions), 0);
    const std::vector<float> got = last_logits(ctx.get(), m);
    const std::vector<float> ref = t::reference_logits(m, p.tokens, p.positions);
    const diff_stats         s   = compare(got, ref);
    std::printf("[%s %s] logits: max abs diff %.3g, max |ref| %.3g, rel %.3g\n", m.config().arch.c_str(), what,
                s.max_abs, s.ref_max, s.rel());
    EXPECT_LT(s.rel(), k_logit_rel_tol);
    EXPECT_EQ(argmax(got), argmax(ref));
}

TEST_P(TinyModel, LogitsMatchReferenceText) {
    const t::tiny_model m = t::make_tiny_model(config_for(GetParam()));
    expect_logits_match(m, text_prompt(m), "text");
}

TEST_P(TinyModel, LogitsMatchReferenceWithoutFlashAttention) {
    const t::tiny_model m   = t::make_tiny_model(config_for(GetParam()));
    const prompt        p   = text_prompt(m);
    ctx_ptr             ctx = make_ctx(m, LLAMA_FLASH_ATTN_TYPE_DISABLED);
    ASSERT_EQ(t::decode_prompt(ctx.get(), m, p.tokens, p.positions), 0);
    const diff_stats s = compare(last_logits(ctx.get(), m), t::reference_logits(m, p.tokens, p.positions));
    std::printf("[%s no-FA] logits: max abs diff %.3g, rel %.3g\n", GetParam().c_str(), s.max_abs, s.rel());
    EXPECT_LT(s.rel(), k_logit_rel_tol);
}

// One more token decoded on top of the prompt (the single-query decode kernels) matches a 21-token reference.
TEST_P(TinyModel, NextTokenMatchesReference) {
    const t::tiny_model m   = t::make_tiny_model(config_for(GetParam()));
    prompt              p   = text_prompt(m, 21);
    ctx_ptr             ctx = make_ctx(m);
    const std::vector<int32_t>     head_tok(p.tokens.begin(), p.tokens.end() - 1);
    const std::vector<t::position> head_pos(p.positions.begin(), p.positions.end() - 1);
    ASSERT_EQ(t::decode_prompt(ctx.get(), m, head_tok, head_pos), 0);
    ASSERT_EQ(t::decode_prompt(ctx.get(), m, { p.tokens.back() }, { p.positions.back() }), 0);
    const diff_stats s = compare(last_logits(ctx.get(), m), t::reference_logits(m, p.tokens, p.positions));
    std::printf("[%s decode] logits: max abs diff %.3g, rel %.3g\n", GetParam().c_str(), s.max_abs, s.rel());
    EXPECT_LT(s.rel(), k_logit_rel_tol);
}

// The comparison is sensitive: wrong positions give logits far outside the tolerance.
TEST_P(TinyModel, WrongPositionsAreDetected) {
    const t::tiny_model m   = t::make_tiny_model(config_for(GetParam()));
    const prompt        p   = text_prompt(m);
    ctx_ptr             ctx = make_ctx(m);
    ASSERT_EQ(t::decode_prompt(ctx.get(), m, p.tokens, p.positions), 0);
    std::vector<t::position> doubled = p.positions;
    for (auto & q : doubled) {
        q = { 2 * q[0], 2 * q[1], 2 * q[2] };
    }
    const diff_stats s = compare(last_logits(ctx.get(), m), t::reference_logits(m, p.tokens, doubled));
    std::printf("[%s] positions x2: rel diff %.3g\n", GetParam().c_str(), s.rel());
    EXPECT_GT(s.rel(), 0.1);

    // RoPE is relative: shifting every position by a constant changes nothing (up to rounding).
    std::vector<t::position> shifted = p.positions;
    for (auto & q : shifted) {
        q = { q[0] + 7, q[1] + 7, q[2] + 7 };
    }
    EXPECT_LT(compare(t::reference_logits(m, p.tokens, shifted), t::reference_logits(m, p.tokens, p.positions)).rel(),
              1e-9);
}

TEST_P(TinyModel, MaskChangesReferenceLogits) {
    const t::tiny_model      m    = t::make_tiny_model(config_for(GetParam()));
    const prompt             p    = text_prompt(m);
    const std::vector<float> full = t::reference_logits(m, p.tokens, p.positions);

    // keep = always true is the same as no mask, exactly
    const t::keep_fn all = [](int32_t, int32_t, int32_t, int32_t) { return true; };
    EXPECT_EQ(t::reference_logits(m, p.tokens, p.positions, all), full);

    // hide keys 3..9 from KV head 1 of layer 0 only; when layer 0 is a SWA layer (gemma3), the 7 keys before the
    // last token, inside its window (keys 3..9 only reach queries up to 16 there, moving the logits by 0.009)
    const int32_t    last = int32_t(p.tokens.size()) - 1;
    const int32_t    k0   = m.is_swa(0) ? last - 7 : 3;
    const t::keep_fn some = [k0](int32_t l, int32_t g, int32_t, int32_t j) { return !(l == 0 && g == 1 && j >= k0 && j < k0 + 7); };
    const diff_stats s1 = compare(t::reference_logits(m, p.tokens, p.positions, some), full);
    // a single key hidden from the last query only, in the last layer
    const t::keep_fn one  = [&](int32_t l, int32_t g, int32_t i, int32_t j) {
        return !(l == m.config().n_layer - 1 && g == 0 && i == last && j == last - 1);
    };
    const diff_stats s2 = compare(t::reference_logits(m, p.tokens, p.positions, one), full);
    std::printf("[%s] mask effect: rel %.3g (layer 0 head 1 keys %d..%d), %.3g (one key)\n", GetParam().c_str(),
                s1.rel(), k0, k0 + 6, s2.rel());
    EXPECT_GT(s1.rel(), 0.05);
    EXPECT_GT(s2.rel(), 0.02);

    // a mask changes deeper layers' K/V but never layer 0's
    const auto kv_full = t::reference_kv(m, p.tokens, p.positions);
    const auto kv_some = t::reference_kv(m, p.tokens, p.positions, some);
    EXPECT_EQ(kv_full[0].k, kv_some[0].k);
    EXPECT_EQ(kv_full[0].v, kv_some[0].v);
    EXPECT_NE(kv_full[1].k, kv_some[1].k);
}

// ---- KV cache vs reference K (after RoPE) and V ----------------------------------------------------------------

struct kv_mismatch {
    double max_k = 0, max_v = 0;
    int    bad   = 0;  // elements outside the F16 tolerance of the layer
};

// Compares model layer il's cells in the blob with the reference. The cells of a cache are the prompt's last n_cells
// tokens in order (all of them, or a SWA cache's window).
kv_mismatch compare_kv(const t::tiny_model & m, const blob_view & b, const std::vector<t::reference_layer_kv> & ref,
                       int32_t il) {
    const t::tiny_config & c   = m.config();
    const auto [sec, l]        = b.layer(m, il);
    const int32_t          d   = c.head_dim(), n_gqa = c.n_head_kv * d, n = sec->n_cells;
    const int32_t          n_tok = int32_t(ref[size_t(il)].k.size() / size_t(n_gqa));
    const double           rel = il == 0 ? k_kv0_rel : k_kv_rel, abs = il == 0 ? k_kv0_abs : k_kv_abs;
    kv_mismatch            r;
    if (n > n_tok) {
        throw std::runtime_error("more cells than tokens");
    }
    for (int32_t g = 0; g < c.n_head_kv; ++g) {
        for (int32_t j = 0; j < n; ++j) {
            for (int32_t e = 0; e < d; ++e) {
                const size_t ri = (size_t(g) * size_t(n_tok) + size_t(n_tok - n + j)) * size_t(d) + size_t(e);
                const size_t bi = size_t(j) * size_t(n_gqa) + size_t(g * d + e);
                const double rk = ref[size_t(il)].k[ri], rv = ref[size_t(il)].v[ri];
                const double dk = std::fabs(sec->k[l][bi] - rk), dv = std::fabs(sec->v[l][bi] - rv);
                r.max_k = std::max(r.max_k, dk);
                r.max_v = std::max(r.max_v, dv);
                r.bad += dk > rel * std::fabs(rk) + abs;
                r.bad += dv > rel * std::fabs(rv) + abs;
            }
        }
    }
    return r;
}

blob_view decode_and_read(const t::tiny_model & m, const prompt & p, llama_flash_attn_type fa) {
    ctx_ptr ctx = make_ctx(m, fa);
    if (t::decode_prompt(ctx.get(), m, p.tokens, p.positions) != 0) {
        throw std::runtime_error("decode failed");
    }
    return parse_blob(get_blob(ctx.get()), m.mrope(), m.config().n_head_kv * m.config().head_dim());
}

void expect_cache_matches(const t::tiny_model & m, const prompt & p, llama_flash_attn_type fa) {
    const t::tiny_config & c = m.config();
    const int32_t          n = int32_t(p.tokens.size());
    const blob_view        b = decode_and_read(m, p, fa);
    int32_t                n_swa_layers = 0;
    for (int32_t il = 0; il < c.n_layer; ++il) {
        n_swa_layers += m.is_swa(il) ? 1 : 0;
    }
    // a plain cache, or iSWA: the global layers' cache, then the SWA layers' cache (holding the window only)
    ASSERT_EQ(b.sections.size(), n_swa_layers > 0 ? 2u : 1u);
    for (size_t si = 0; si < b.sections.size(); ++si) {
        const blob_section & sec  = b.sections[si];
        const bool           swa  = si == 1;
        const int32_t        want = swa ? std::min(n, m.n_swa()) : n;  // text prompts: one position per token
        ASSERT_EQ(sec.n_cells, want) << "section " << si;
        ASSERT_EQ(int32_t(sec.k.size()), swa ? n_swa_layers : c.n_layer - n_swa_layers) << "section " << si;
        for (int32_t cell = 0; cell < sec.n_cells; ++cell) {
            const size_t j = size_t(n - sec.n_cells + cell);
            EXPECT_EQ(sec.pos[size_t(cell)], p.positions[j][0]) << "cell " << cell;
            if (m.mrope()) {
                EXPECT_EQ(sec.ext[size_t(cell)][0], p.positions[j][2]) << "cell " << cell;  // x
                EXPECT_EQ(sec.ext[size_t(cell)][1], p.positions[j][1]) << "cell " << cell;  // y
                EXPECT_EQ(sec.ext[size_t(cell)][2], p.image[j] ? -1 : p.tokens[j]) << "cell " << cell;
            }
        }
    }

    const auto ref = t::reference_kv(m, p.tokens, p.positions);
    for (int32_t il = 0; il < c.n_layer; ++il) {
        const kv_mismatch r = compare_kv(m, b, ref, il);
        std::printf("[%s v_trans=%d] layer %d%s cache vs reference: K max abs %.3g, V max abs %.3g\n", c.arch.c_str(),
                    int(b.layer(m, il).first->v_trans), il, m.is_swa(il) ? " (SWA)" : "", r.max_k, r.max_v);
        EXPECT_EQ(r.bad, 0) << "layer " << il;
    }
}

TEST_P(TinyModel, CacheMatchesReferenceKV) {
    const t::tiny_model m = t::make_tiny_model(config_for(GetParam()));
    expect_cache_matches(m, text_prompt(m), LLAMA_FLASH_ATTN_TYPE_AUTO);
    expect_cache_matches(m, text_prompt(m), LLAMA_FLASH_ATTN_TYPE_DISABLED);  // transposed V in the blob
}

INSTANTIATE_TEST_SUITE_P(Archs, TinyModel, ::testing::Values("llama", "qwen2", "qwen2vl", "qwen3vl", "gemma3"),
                         [](const auto & info) { return info.param; });

// ---- qwen2vl with an image-like block ----------------------------------------------------------------------------

TEST(TinyModelQwen2vl, ImageBlockMatchesReference) {
    const t::tiny_model m = t::make_tiny_model(config_for("qwen2vl"));
    const prompt        p = image_prompt(m);
    expect_logits_match(m, p, "image");

    // the y/x planes matter: treating the image tokens as plain (t, t, t) gives clearly different logits
    std::vector<t::position> flat = p.positions;
    for (auto & q : flat) {
        q = { q[0], q[0], q[0] };
    }
    const diff_stats s = compare(t::reference_logits(m, p.tokens, flat), t::reference_logits(m, p.tokens, p.positions));
    std::printf("[qwen2vl image] y/x ignored: rel diff %.3g\n", s.rel());
    EXPECT_GT(s.rel(), 0.02);  // measured 0.04: y/x only move the low-frequency pairs of a 3-row image
}

TEST(TinyModelQwen2vl, ImageBlockCacheMatchesReferenceKV) {
    const t::tiny_model m = t::make_tiny_model(config_for("qwen2vl"));
    const prompt        p = image_prompt(m);
    expect_cache_matches(m, p, LLAMA_FLASH_ATTN_TYPE_AUTO);

    // Layer-0 K pins the plane mapping down: ignoring y/x, or swapping them, misses the cache at image cells.
    const blob_view          b    = decode_and_read(m, p, LLAMA_FLASH_ATTN_TYPE_AUTO);
    std::vector<t::position> flat = p.positions, swapped = p.positions;
    for (size_t i = 0; i < p.positions.size(); ++i) {
        flat[i]    = { p.positions[i][0], p.positions[i][0], p.positions[i][0] };
        swapped[i] = { p.positions[i][0], p.positions[i][2], p.positions[i][1] };
    }
    const int bad_flat    = compare_kv(m, b, t::reference_kv(m, p.tokens, flat), 0).bad;
    const int bad_swapped = compare_kv(m, b, t::reference_kv(m, p.tokens, swapped), 0).bad;
    std::printf("[qwen2vl image] layer-0 K/V elements off with y/x ignored: %d, with y/x swapped: %d\n", bad_flat,
                bad_swapped);
    EXPECT_GT(bad_flat, 50);
    EXPECT_GT(bad_swapped, 50);
}

// ---- qwen3vl: interleaved M-RoPE and deepstack inputs ----------------------------------------------------------

t::tiny_config qwen3vl_deepstack_config() {
    t::tiny_config c     = config_for("qwen3vl");
    c.n_layer            = 3;
    c.n_deepstack_layers = 2;  // n_embd_inp 192; the last layer cannot be one (see tiny_config)
    return c;
}

// Image inputs with their deepstack parts replaced by zeros (text-like).
t::input_embeddings without_deepstack(const t::tiny_model & m, const prompt & p) {
    t::input_embeddings in(p.tokens.size());
    for (size_t i = 0; i < p.tokens.size(); ++i) {
        if (p.image[i]) {
            in[i] = m.input_embedding(p.tokens[i]);
            std::fill(in[i].begin() + m.config().n_embd, in[i].end(), 0.0f);
        }
    }
    return in;
}

TEST(TinyModelQwen3vl, ImageBlockWithDeepstackMatchesReference) {
    const t::tiny_model m = t::make_tiny_model(qwen3vl_deepstack_config());
    ASSERT_EQ(llama_model_n_embd_inp(m.get()), 3 * m.config().n_embd);
    const prompt p = image_prompt(m);
    ASSERT_EQ(t::embedding_tokens(m, p.positions), p.image);
    expect_logits_match(m, p, "image+deepstack");
    {
        ctx_ptr ctx = make_ctx(m, LLAMA_FLASH_ATTN_TYPE_DISABLED);
        ASSERT_EQ(t::decode_prompt(ctx.get(), m, p.tokens, p.positions), 0);
        const diff_stats s = compare(last_logits(ctx.get(), m), t::reference_logits(m, p.tokens, p.positions));
        std::printf("[qwen3vl image+deepstack no-FA] logits: rel %.3g\n", s.rel());
        EXPECT_LT(s.rel(), k_logit_rel_tol);
    }

    // the deepstack parts matter: the reference without them is far off
    const std::vector<float> ref  = t::reference_logits(m, p.tokens, p.positions);
    const diff_stats         ds   = compare(t::reference_logits(m, p.tokens, p.positions, {}, {}, without_deepstack(m, p)), ref);
    // and so do the y/x planes
    std::vector<t::position> flat = p.positions;
    for (auto & q : flat) {
        q = { q[0], q[0], q[0] };
    }
    const diff_stats yx = compare(t::reference_logits(m, p.tokens, flat), ref);
    std::printf("[qwen3vl image] deepstack parts zeroed: rel diff %.3g; y/x ignored: rel diff %.3g\n", ds.rel(),
                yx.rel());
    EXPECT_GT(ds.rel(), 3 * k_logit_rel_tol);
    EXPECT_GT(yx.rel(), 3 * k_logit_rel_tol);
}

TEST(TinyModelQwen3vl, ImageBlockCacheMatchesReferenceKV) {
    const t::tiny_model m = t::make_tiny_model(qwen3vl_deepstack_config());
    const prompt        p = image_prompt(m);
    expect_cache_matches(m, p, LLAMA_FLASH_ATTN_TYPE_AUTO);
    expect_cache_matches(m, p, LLAMA_FLASH_ATTN_TYPE_DISABLED);

    // Layer-0 K pins IMROPE down: y/x swapped misses the image cells; and sections {3,3,2,0}, which differ only in
    // rotating pair 6 by t instead of leaving it to plane 3 (= 0 in llama.cpp), miss every cell but t = 0.
    const blob_view          b       = decode_and_read(m, p, LLAMA_FLASH_ATTN_TYPE_AUTO);
    std::vector<t::position> swapped = p.positions;
    for (auto & q : swapped) {
        q = { q[0], q[2], q[1] };
    }
    t::tiny_config c3     = m.config();
    c3.rope_sections      = { 3, 3, 2, 0 };
    const t::tiny_model m3 = t::make_tiny_model(c3);  // the same weights
    ASSERT_EQ(m3.tensor("blk.0.attn_k.weight").data, m.tensor("blk.0.attn_k.weight").data);
    const int bad_swapped = compare_kv(m, b, t::reference_kv(m, p.tokens, swapped), 0).bad;
    const int bad_plane3  = compare_kv(m, b, t::reference_kv(m3, p.tokens, p.positions), 0).bad;
    std::printf("[qwen3vl image] layer-0 K/V elements off with y/x swapped: %d, with pair 6 rotated by t: %d\n",
                bad_swapped, bad_plane3);
    EXPECT_GT(bad_swapped, 50);
    EXPECT_GT(bad_plane3, 50);
}

// Explicit inputs (as mtmd's image embeddings will be): any n_embd_inp floats per token, also for a text-positioned
// token, go to llama.cpp as embedding rows and into the reference the same way.
TEST(TinyModelQwen3vl, ExplicitInputsMatchReference) {
    const t::tiny_model m = t::make_tiny_model(qwen3vl_deepstack_config());
    prompt              p = image_prompt(m);
    t::input_embeddings in(p.tokens.size());
    for (size_t i = 0; i < p.tokens.size(); ++i) {
        if (p.image[i] || i == 2) {
            in[i] = m.input_embedding((p.tokens[i] + 5) % m.config().n_vocab);
            for (size_t e = size_t(m.config().n_embd); e < in[i].size(); ++e) {
                in[i][e] *= -2.0f;
            }
        }
    }
    p.image = t::embedding_tokens(m, p.positions, in);
    EXPECT_TRUE(p.image[2]);
    ctx_ptr ctx = make_ctx(m);
    ASSERT_EQ(t::decode_prompt(ctx.get(), m, p.tokens, p.positions, 0, in), 0);
    const std::vector<float> got = last_logits(ctx.get(), m);
    const diff_stats         s   = compare(got, t::reference_logits(m, p.tokens, p.positions, {}, {}, in));
    const diff_stats         d   = compare(got, t::reference_logits(m, p.tokens, p.positions));
    std::printf("[qwen3vl explicit inputs] logits: rel %.3g; vs the default inputs' reference: %.3g\n", s.rel(),
                d.rel());
    EXPECT_LT(s.rel(), k_logit_rel_tol);
    EXPECT_GT(d.rel(), 3 * k_logit_rel_tol);

    // a wrong size is refused (before anything is decoded)
    in[2].pop_back();
    ctx_ptr fresh = make_ctx(m);
    EXPECT_THROW(t::reference_logits(m, p.tokens, p.positions, {}, {}, in), std::invalid_argument);
    EXPECT_THROW(t::decode_prompt(fresh.get(), m, p.tokens, p.positions, 0, in), std::invalid_argument);
    EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(fresh.get()), 0), -1);
}

// ---- gemma3: interleaved sliding-window attention -----------------------------------------------------------------

t::tiny_config gemma3_config() {
    t::tiny_config c = config_for("gemma3");
    c.n_layer        = 4;  // layers 0, 2 SWA (window 8, RoPE base 1e4); 1, 3 global (RoPE base 1e6)
    return c;
}

TEST(TinyModelGemma3, PromptLongerThanTheWindowMatchesReference) {
    const t::tiny_model m = t::make_tiny_model(gemma3_config());
    ASSERT_EQ(llama_model_n_swa(m.get()), 8);
    ASSERT_TRUE(m.is_swa(0) && !m.is_swa(1) && m.is_swa(2) && !m.is_swa(3));
    const prompt p = text_prompt(m, 24);
    expect_logits_match(m, p, "24 tokens, window 8");
    const std::vector<float> ref = t::reference_logits(m, p.tokens, p.positions);
    {
        ctx_ptr ctx = make_ctx(m, LLAMA_FLASH_ATTN_TYPE_DISABLED);
        ASSERT_EQ(t::decode_prompt(ctx.get(), m, p.tokens, p.positions), 0);
        const diff_stats s = compare(last_logits(ctx.get(), m), ref);
        std::printf("[gemma3 24 tokens, window 8, no-FA] logits: rel %.3g\n", s.rel());
        EXPECT_LT(s.rel(), k_logit_rel_tol);
    }

    // The same weights without the window's mask (a window no prompt here reaches), or with the SWA layers at the
    // global RoPE base, give clearly different logits.
    t::tiny_config wide = m.config();
    wide.sliding_window = 4096;
    t::tiny_config one_base     = m.config();
    one_base.rope_freq_base_swa = one_base.rope_freq_base;
    const diff_stats no_mask = compare(t::reference_logits(t::make_tiny_model(wide), p.tokens, p.positions), ref);
    const diff_stats base    = compare(t::reference_logits(t::make_tiny_model(one_base), p.tokens, p.positions), ref);
    std::printf("[gemma3] reference without the SWA mask: rel diff %.3g; SWA layers at the global base: %.3g\n",
                no_mask.rel(), base.rel());
    EXPECT_GT(no_mask.rel(), 3 * k_logit_rel_tol);
    EXPECT_GT(base.rel(), 3 * k_logit_rel_tol);

    // the cache: the global layers hold all 24 cells, the SWA layers (their own cache) the last 8
    expect_cache_matches(m, p, LLAMA_FLASH_ATTN_TYPE_AUTO);
}

// Embedding inputs are not multiplied by sqrt(n_embd) (llama.cpp scales token batches only).
TEST(TinyModelGemma3, EmbeddingInputsAreNotScaled) {
    const t::tiny_model m = t::make_tiny_model(gemma3_config());
    const prompt        p = text_prompt(m);
    t::input_embeddings raw(p.tokens.size()), scaled(p.tokens.size());
    for (size_t i = 5; i < 11; ++i) {
        raw[i]    = m.input_embedding(p.tokens[i]);
        scaled[i] = raw[i];
        for (float & x : scaled[i]) {
            x *= std::sqrt(float(m.config().n_embd));
        }
    }
    const std::vector<float> text = t::reference_logits(m, p.tokens, p.positions);
    for (const bool scale : { false, true }) {
        const t::input_embeddings & in  = scale ? scaled : raw;
        ctx_ptr                     ctx = make_ctx(m);
        ASSERT_EQ(t::decode_prompt(ctx.get(), m, p.tokens, p.positions, 0, in), 0);
        const std::vector<float> got = last_logits(ctx.get(), m);
        const diff_stats         s   = compare(got, t::reference_logits(m, p.tokens, p.positions, {}, {}, in));
        const diff_stats         d   = compare(got, text);
        std::printf("[gemma3 %s rows as embeddings] logits: rel %.3g; vs the all-token reference: %.3g\n",
                    scale ? "sqrt(n_embd)-scaled" : "unscaled", s.rel(), d.rel());
        EXPECT_LT(s.rel(), k_logit_rel_tol);
        if (scale) {
            EXPECT_LT(d.rel(), k_logit_rel_tol);  // the same as feeding the tokens
        } else {
            EXPECT_GT(d.rel(), 3 * k_logit_rel_tol);
        }
    }
}

// Other seeds and shapes (MHA, MQA, wider heads with other sections, 3 layers) also match.
TEST(TinyModelShapes, OtherSeedsAndShapesMatchReference) {
    std::vector<t::tiny_config> cfgs;
    for (const char * arch : { "llama", "qwen2", "qwen2vl", "qwen3vl", "gemma3" }) {
        t::tiny_config c = config_for(arch);
        c.seed           = 7;
        cfgs.push_back(c);
        c.n_layer = 3, c.n_embd = 128, c.n_head = 4, c.n_head_kv = 4, c.n_ff = 96, c.n_vocab = 200;
        c.rope_sections = { 4, 6, 6, 0 };  // head_dim 32
        c.n_deepstack_layers = 2;          // qwen3vl
        c.swa_pattern = 3, c.sliding_window = 5;  // gemma3: layers 0, 1 SWA, 2 global
        cfgs.push_back(c);
        c.n_head_kv = 1, c.rope_freq_base = 1e6f, c.seed = 11;
        c.rope_sections = { 6, 5, 5, 0 };
        c.sliding_window = 0;  // gemma3 without SWA: one plain cache, one RoPE base
        cfgs.push_back(c);
    }
    for (const t::tiny_config & c : cfgs) {
        const t::tiny_model m = t::make_tiny_model(c);
        const prompt        p = m.mrope() ? image_prompt(m) : text_prompt(m, 24);
        SCOPED_TRACE(c.arch + " n_embd " + std::to_string(c.n_embd) + " n_head_kv " + std::to_string(c.n_head_kv) +
                     " seed " + std::to_string(c.seed));
        expect_logits_match(m, p, "shape");
        const blob_view b = decode_and_read(m, p, LLAMA_FLASH_ATTN_TYPE_AUTO);
        EXPECT_EQ(compare_kv(m, b, t::reference_kv(m, p.tokens, p.positions), 0).bad, 0);
    }
}

TEST(TinyModelConfig, RejectsBadConfigs) {
    t::tiny_config c;
    c.arch = "gpt2";
    EXPECT_THROW(t::make_tiny_model(c), std::invalid_argument);
    c       = {};
    c.n_head_kv = 3;
    EXPECT_THROW(t::make_tiny_model(c), std::invalid_argument);
    c                  = {};
    c.arch             = "qwen2vl";
    c.rope_sections[3] = 1;
    EXPECT_THROW(t::make_tiny_model(c), std::invalid_argument);
    c             = {};
    c.weight_type = "q4_k";
    EXPECT_THROW(t::make_tiny_model(c), std::invalid_argument);
    c           = {};
    c.n_threads = 0;
    EXPECT_THROW(t::make_tiny_model(c), std::invalid_argument);
    c                    = config_for("qwen3vl");
    c.n_deepstack_layers = c.n_layer;  // llama.cpp would abort in llama_decode
    EXPECT_THROW(t::make_tiny_model(c), std::invalid_argument);
    c             = config_for("gemma3");
    c.swa_pattern = 1;  // no SWA layer: llama.cpp asserts when it makes the iSWA cache
    EXPECT_THROW(t::make_tiny_model(c), std::invalid_argument);
    c                = config_for("gemma3");
    c.sliding_window = -1;
    EXPECT_THROW(t::make_tiny_model(c), std::invalid_argument);
}

// ---- storage options: weight_type, keep_reference_weights, n_threads (bench-decode's models) --------------------

// FNV-1a over every tensor's name, shape and float bits.
uint64_t fingerprint(const t::tiny_model & m) {
    uint64_t h   = 1469598103934665603ull;
    auto     mix = [&](const void * p, size_t n) {
        for (size_t i = 0; i < n; ++i) {
            h = (h ^ static_cast<const unsigned char *>(p)[i]) * 0x100000001b3ull;
        }
    };
    for (const auto & [name, tt] : m.tensors()) {
        mix(name.data(), name.size());
        mix(tt.ne.data(), sizeof tt.ne);
        mix(tt.data.data(), tt.data.size() * sizeof(float));
    }
    return h;
}

t::tiny_config wide_config(const std::string & arch) {
    t::tiny_config c = config_for(arch);
    c.seed           = 7;
    c.n_layer = 3, c.n_embd = 128, c.n_head = 4, c.n_head_kv = 4, c.n_ff = 96, c.n_vocab = 200;
    c.rope_sections = { 4, 6, 6, 0 };
    return c;
}

// The weights the tests' tolerances were set on: fingerprints taken with the builder before it learned weight types,
// chunked filling and threads (one sequential normal() per element).
TEST(TinyModelWeights, WeightsAreThoseOfTheOriginalBuilder) {
    for (const bool llama : { true, false }) {
        const char * arch = llama ? "llama" : "qwen2vl";
        EXPECT_EQ(fingerprint(t::make_tiny_model(config_for(arch))), llama ? 0x5f1a1c27a8d1fcdcull : 0x99c485f9a5fac19full);
        EXPECT_EQ(fingerprint(t::make_tiny_model(wide_config(arch))), llama ? 0xbe900cebd2e82df8ull : 0x8e15631806b23b9aull);
    }
}

TEST_P(TinyModel, ThreadsDoNotChangeTheWeights) {
    t::tiny_config c = wide_config(GetParam());
    const uint64_t one = fingerprint(t::make_tiny_model(c));
    c.n_threads        = 3;
    EXPECT_EQ(fingerprint(t::make_tiny_model(c)), one);
}

// Without the F32 copy the model is the same (bit-identical logits), only tensors() is empty; progress is reported.
TEST_P(TinyModel, WithoutReferenceWeightsTheModelIsTheSame) {
    const t::tiny_model ref = t::make_tiny_model(config_for(GetParam()));
    t::tiny_config      c   = config_for(GetParam());
    c.keep_reference_weights = false;
    c.n_threads              = 2;
    uint64_t done = 0, total = 0;
    int      calls = 0;
    c.on_progress  = [&](uint64_t d, uint64_t tot) { done = d, total = tot, ++calls; };
    const t::tiny_model m = t::make_tiny_model(c);
    EXPECT_TRUE(m.tensors().empty());
    EXPECT_THROW(m.embedding(0), std::out_of_range);
    EXPECT_EQ(m.n_params(), ref.n_params());
    EXPECT_EQ(m.n_bytes(), ref.n_bytes());
    EXPECT_GE(calls, int(ref.tensors().size()));  // once per fill (llama's rope_freqs: once per layer)
    EXPECT_EQ(done, ref.n_bytes());
    EXPECT_GE(total, done);

    const prompt p = text_prompt(ref);
    std::vector<float> logits[2];
    for (int k = 0; k < 2; ++k) {
        const t::tiny_model & mk  = k == 0 ? ref : m;
        ctx_ptr               ctx = make_ctx(mk);
        ASSERT_EQ(t::decode_prompt(ctx.get(), mk, p.tokens, p.positions), 0);
        logits[k] = last_logits(ctx.get(), mk);
    }
    EXPECT_EQ(logits[0], logits[1]);
}

TEST_P(TinyModel, ReleaseHandsOverTheModel) {
    t::tiny_model m   = t::make_tiny_model(config_for(GetParam()));
    llama_model * raw = m.release();
    EXPECT_NE(raw, nullptr);
    EXPECT_EQ(m.get(), nullptr);
    llama_model_free(raw);
}

// Quantized and F16 matrices: the kept copy is what llama.cpp stores (dequantized), close to the F32 draw, and the
// reference on it reproduces llama.cpp. llama.cpp's CPU matmul also rounds the activations (to Q8_0 for Q8_0/Q4_0
// weights, to F16 for F16 ones), which the double-precision reference does not, hence the looser logit bound.
TEST_P(TinyModel, QuantizedWeightsMatchReference) {
    const t::tiny_model f32 = t::make_tiny_model(config_for(GetParam()));
    for (const char * type : { "f16", "q8_0", "q4_0" }) {
        SCOPED_TRACE(type);
        t::tiny_config c = config_for(GetParam());
        c.weight_type    = type;
        const t::tiny_model m = t::make_tiny_model(c);
        EXPECT_EQ(m.n_params(), f32.n_params());
        EXPECT_LT(m.n_bytes(), f32.n_bytes());
        const t::tiny_tensor & w = m.tensor("blk.1.ffn_up.weight"), & w32 = f32.tensor("blk.1.ffn_up.weight");
        double max_err = 0, max_abs = 0;
        for (size_t i = 0; i < w.data.size(); ++i) {
            max_err = std::max(max_err, std::fabs(double(w.data[i]) - double(w32.data[i])));
            max_abs = std::max(max_abs, std::fabs(double(w32.data[i])));
        }
        const double bound = std::string(type) == "q4_0" ? 0.15 : std::string(type) == "q8_0" ? 0.01 : 1e-3;
        EXPECT_GT(max_err, 0.0);
        EXPECT_LT(max_err / max_abs, bound);
        EXPECT_EQ(m.tensor("blk.1.ffn_norm.weight").data, f32.tensor("blk.1.ffn_norm.weight").data);  // stays F32

        const prompt p   = text_prompt(m);
        ctx_ptr      ctx = make_ctx(m);
        ASSERT_EQ(t::decode_prompt(ctx.get(), m, p.tokens, p.positions), 0);
        const diff_stats s = compare(last_logits(ctx.get(), m), t::reference_logits(m, p.tokens, p.positions));
        std::printf("[%s %s] logits vs reference on the stored weights: rel %.3g\n", GetParam().c_str(), type,
                    s.rel());
        EXPECT_LT(s.rel(), 3e-2);
    }
}

}  // namespace
