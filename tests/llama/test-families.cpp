// Every VLM family ecokv runs (tiny-mmproj.h vlm_families(): LLaVA-1.5, Qwen2-VL, LLaVA-NeXT, Qwen2.5-VL, InternVL3,
// SmolVLM, Gemma 3, Qwen3-VL), loaded from GGUF files through libmtmd as ecokv run loads them, with one image prompt:
//   - the modality map the methods see is the family's layout, counted by hand (text markers, tiles, overview);
//   - a covering budget answers exactly as the uncompressed cache;
//   - a selection that keeps the same cells in every head (StreamingLLM) gives the logits of llama.cpp's own cache
//     with the dropped cells removed by llama_memory_seq_rm (positions kept): an independent reference through
//     llama.cpp's and mtmd's public API only;
//   - a selection with its own count per KV head (AdaKV) gives the logits of tiny-model.h's reference forward with
//     each head's dropped cells masked, the prompt fed cell by cell from mtmd (image embeddings, M-RoPE positions,
//     Gemma 3's non-causal image).
#include "ecokv/llama-generate.h"
#include "ecokv/llama-session.h"
#include "session-test-util.h"
#include "test-util.h"
#include "tiny-mmproj.h"
#include "tiny-model.h"

#include <llama.h>
#include <mtmd-helper.h>
#include <mtmd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>

namespace {

using namespace ecokv::test;
namespace el = ecokv::llama;

const std::string k_prompt = "describe <__media__> please";  // "describe " and " please": 9 and 7 bytes
constexpr int32_t k_width = 112, k_height = 84;                // 2 x 2 LLaVA-NeXT / InternVL tiles, 3 x 2 Idefics3

struct span {
    bool    image;
    int32_t n;
    bool    operator==(const span &) const = default;
};

// The prompt's cells per family, counted by hand: one byte one token in the bpe vocabulary, but its control tokens
// (<fake_token_around_image>, <global-img>) and "\n\n"; mtmd's markers are text ("<|vision_start|>" 16 bytes,
// "<|vision_end|>" 14, "<img>" 5, "</img>" 6, "<row_1_col_1>" 13). Chunk sizes: tiny-mmproj.h expected_image_layout.
std::vector<span> hand_counted(const std::string & family) {
    const int32_t describe = 9, please = 7;
    if (family == "llava-1.5") {  // no markers; 56 x 56, 4 x 4 patches
        return { { false, describe }, { true, 16 }, { false, please } };
    }
    if (family == "qwen2-vl" || family == "qwen2.5-vl" || family == "qwen3-vl") {  // 112 x 84 in 28-pixel merges: 4 x 3
        return { { false, describe + 16 }, { true, 12 }, { false, 14 + please } };
    }
    if (family == "gemma-3") {  // "<start_of_image>" 16 bytes, 4 x 4 patches pooled 2 x 2, "<end_of_image>" 14
        return { { false, describe + 16 }, { true, 4 }, { false, 14 + please } };
    }
    if (family == "llava-next") {  // 4 tiles and the overview, 16 tokens each, nothing between them
        return { { false, describe }, { true, 16 }, { true, 16 }, { true, 16 }, { true, 16 }, { true, 16 },
                 { false, please } };
    }
    if (family == "internvl3") {  // <img>, 4 tiles and the overview of 4 tokens (2 x 2 pixel shuffle), </img>
        return { { false, describe + 5 }, { true, 4 }, { true, 4 }, { true, 4 }, { true, 4 }, { true, 4 },
                 { false, 6 + please } };
    }
    // smolvlm: 3 x 2 tiles, each after <fake_token_around_image><row_Y_col_X>, "\n" ending the first row, then
    // "\n\n" <fake_token_around_image> <global-img>, the overview, <fake_token_around_image>
    const int32_t tile = 1 + 13;
    return { { false, describe + tile }, { true, 4 }, { false, tile }, { true, 4 }, { false, tile }, { true, 4 },
             { false, 1 + tile },        { true, 4 }, { false, tile }, { true, 4 }, { false, tile }, { true, 4 },
             { false, 3 },               { true, 4 }, { false, 1 + please } };
}

struct family_fixture {
    temp_dir                dir;
    tiny_vlm_files          files;
    std::string             image;
    el::session_options     options;

    explicit family_fixture(const vlm_family & f) : files(write_tiny_vlm(dir.path().string(), f)) {
        image = dir / "image.ppm";
        write_test_ppm(image, k_width, k_height, 5);
        options.model_path  = files.model;
        options.mmproj_path = files.mmproj;
        options.n_ctx       = 512;
        options.n_threads   = 2;
    }
};

// llama.cpp's own cache holding the same prompt (mtmd's chunks evaluated by its helper), and each cell's position.
struct plain_context {
    struct model_free {
        void operator()(llama_model * m) const { llama_model_free(m); }
    };
    struct ctx_free {
        void operator()(llama_context * c) const { llama_free(c); }
    };
    struct mtmd_free_ {
        void operator()(mtmd_context * c) const { mtmd_free(c); }
    };
    std::unique_ptr<llama_model, model_free>   model;
    std::unique_ptr<llama_context, ctx_free>   ctx;
    std::vector<llama_pos>                     cell_pos;  // temporal position of each prompt cell
    std::vector<bool>                          cell_image;
    llama_pos                                  n_past = 0;

    explicit plain_context(const family_fixture & f) {
        llama_model_params mp = llama_model_default_params();
        mp.n_gpu_layers       = tiny_config::test_gpu_layers();
        model.reset(llama_model_load_from_file(f.files.model.c_str(), mp));
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx                = 512;
        cp.n_threads = cp.n_threads_batch = 2;
        cp.flash_attn_type = f.options.flash_attn;
        ctx.reset(llama_init_from_model(model.get(), cp));
        mtmd_context_params pp = mtmd_context_params_default();
        pp.use_gpu             = false;
        pp.warmup              = false;
        pp.print_timings       = false;
        std::unique_ptr<mtmd_context, mtmd_free_> mtmd(mtmd_init_from_file(f.files.mmproj.c_str(), model.get(), pp));
        if (!model || !ctx || !mtmd) {
            throw std::runtime_error("the plain llama.cpp context could not be made");
        }
        mtmd_bitmap * bmp =
            mtmd_helper_bitmap_init_from_file(mtmd.get(), f.image.c_str(), false, mtmd_helper_init_opt_default()).bitmap;
        mtmd_input_chunks * chunks = mtmd_input_chunks_init();
        const std::string   text   = k_prompt;
        const mtmd_input_text in{ text.c_str(), text.size(), true, true };
        const mtmd_bitmap *   bitmaps[] = { bmp };
        if (mtmd_tokenize(mtmd.get(), chunks, &in, bitmaps, 1) != 0) {
            throw std::runtime_error("mtmd_tokenize failed");
        }
        const bool mrope = mtmd_decode_use_mrope(mtmd.get());
        for (size_t i = 0; i < mtmd_input_chunks_size(chunks); ++i) {
            const mtmd_input_chunk * c     = mtmd_input_chunks_get(chunks, i);
            const bool               img   = mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_IMAGE;
            const auto               n     = int32_t(mtmd_input_chunk_get_n_tokens(c));
            for (int32_t t = 0; t < n; ++t) {  // an M-RoPE image's cells all stand at its first position
                cell_pos.push_back(img && mrope ? n_past : n_past + t);
                cell_image.push_back(img);
            }
            llama_pos next = n_past;
            if (mtmd_helper_eval_chunk_single(mtmd.get(), ctx.get(), c, n_past, 0, 512, i + 1 == mtmd_input_chunks_size(chunks),
                                              &next) != 0) {
                throw std::runtime_error("mtmd_helper_eval_chunk_single failed");
            }
            n_past = next;
        }
        mtmd_input_chunks_free(chunks);
        mtmd_bitmap_free(bmp);
    }

    // Removes the prompt cells not in `kept` (positions of M-RoPE images go all together or not at all).
    void remove_all_but(const std::vector<int32_t> & kept) {
        const std::set<int32_t> keep(kept.begin(), kept.end());
        for (int32_t c = 0; c < int32_t(cell_pos.size()); ++c) {
            if (!keep.count(c)) {
                llama_memory_seq_rm(llama_get_memory(ctx.get()), 0, cell_pos[size_t(c)], cell_pos[size_t(c)] + 1);
            }
        }
    }
};

std::vector<span> spans_of(const std::vector<uint8_t> & modality, const std::vector<el::media_grid> & images) {
    std::vector<span> out;
    size_t            next_image = 0;
    for (int32_t c = 0; c < int32_t(modality.size());) {
        if (modality[size_t(c)] == 1 && next_image < images.size() && images[next_image].first_cell == c) {
            const el::media_grid & g = images[next_image++];
            out.push_back({ true, g.n_rows * g.n_cols });
            c += g.n_rows * g.n_cols;
            continue;
        }
        if (out.empty() || out.back().image) {
            out.push_back({ false, 0 });
        }
        ++out.back().n;
        ++c;
    }
    return out;
}

class family_test : public ::testing::TestWithParam<vlm_family> {};

TEST_P(family_test, the_methods_see_the_families_layout) {
    const family_fixture f(GetParam());
    const el::session    s(f.options);
    const el::prompt     p = s.make_prompt(k_prompt, { f.image });
    const std::vector<span> want = hand_counted(GetParam().name);
    EXPECT_EQ(spans_of(p.modality(), p.images()), want);
    int32_t n_image = 0, n_cells = 0;
    for (const span & x : want) {
        n_image += x.image ? x.n : 0;
        n_cells += x.n;
    }
    EXPECT_EQ(p.n_media(), n_image);
    EXPECT_EQ(p.n_cells(), n_cells);
    for (const el::media_grid & g : p.images()) {
        EXPECT_EQ(g.image, 0);
        EXPECT_EQ(g.n_parts, int32_t(p.images().size()));
    }
    // units (what two prompts compare to share a cached prefix): one per text token and one per image chunk, each
    // chunk of the image named apart
    int32_t n_units = 0;
    for (const span & x : want) {
        n_units += x.image ? 1 : x.n;
    }
    ASSERT_EQ(int32_t(p.units().size()), n_units);
    std::set<uint64_t> image_units;
    for (uint64_t u : p.units()) {
        if (u >> 63) {
            image_units.insert(u);
        }
    }
    EXPECT_EQ(image_units.size(), p.images().size());
}

// A budget covering the prompt keeps every cell: the answer's logits are the uncompressed cache's, step by step, even
// when the full cache answered first (an iSWA model's window is then the prompt's, not the one the answer moved on).
TEST_P(family_test, a_covering_budget_answers_as_the_full_cache) {
    const family_fixture f(GetParam());
    const el::session    s(f.options);
    const el::prompt     p    = s.make_prompt(k_prompt, { f.image });
    const auto           spec = ecokv::parse_method("snapkv+ecokv");
    el::sequence         full = s.prefill(p, 16, ecokv::requirements(spec, budget(1024)));
    const el::generation a    = full.greedy(8, true);  // decoded before the compression, which starts from the prompt
    el::sequence         kept = full.compress(spec, budget(1024), 16);
    EXPECT_EQ(kept.n_cells(), p.n_cells());
    EXPECT_LT(rel_diff(kept.logits(), a.logits[0]), 1e-5);
    const el::generation b = kept.greedy(8, true);
    EXPECT_EQ(a.tokens, b.tokens);
    for (size_t i = 0; i < std::min(a.logits.size(), b.logits.size()); ++i) {
        EXPECT_LT(rel_diff(b.logits[i], a.logits[i]), 1e-5) << "step " << i;
    }
}

// StreamingLLM keeps the same cells in every head: llama.cpp's own cache with the others removed is its reference.
// Without flash attention: CPU flash attention sums V in F16, in the order of the cache's slots, and llama.cpp puts
// the new tokens into the slots seq_rm freed, so the two caches would round differently (3e-4 of the logits).
// On a device the two caches' lengths (the kept cells; the prompt with holes) pick different kernels and splits of
// the same sums: 1.4e-5 to 2.3e-4 of the logits on lavapipe with F32 shaders (docs/gpu.md), hence 5e-4 there.
TEST_P(family_test, a_head_uniform_selection_is_llama_cpps_cache_without_the_dropped_cells) {
    const double tolerance = el::gpu_offload_supported() ? 5e-4 : 1e-5;
    family_fixture f(GetParam());
    f.options.flash_attn = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    const el::session    s(f.options);
    const el::prompt     p    = s.make_prompt(k_prompt, { f.image });
    const auto           spec = ecokv::parse_method("streamingllm");
    // M-RoPE images keep all their cells or none (their cells share one position): keep 4 sinks and the tail.
    const int32_t        tail = hand_counted(GetParam().name).back().n;
    const ecokv::method_params params = budget(4 + tail, 4);
    el::sequence          full = s.prefill(p, 16, ecokv::requirements(spec, params));
    el::sequence          kept = full.compress(spec, params, 16);
    const auto &          cells = kept.kept_cells();
    ASSERT_FALSE(cells.empty());
    for (const auto & h : cells) {
        ASSERT_EQ(h, cells[0]);
    }
    ASSERT_EQ(int32_t(cells[0].size()), 4 + tail);

    plain_context ref(f);
    ASSERT_EQ(int32_t(ref.cell_pos.size()), p.n_cells());
    ref.remove_all_but(cells[0]);
    const std::vector<llama_token> next = { 40, 41, 120, 7, 255 };
    llama_pos                      pos  = ref.n_past;
    double                         worst = 0, power = 0;
    for (size_t i = 0; i < next.size(); ++i) {
        const std::vector<float> want = el::decode(ref.ctx.get(), { next[i] }, pos++);
        kept.decode({ next[i] });
        worst = std::max(worst, rel_diff(kept.logits(), want));
        EXPECT_LT(rel_diff(kept.logits(), want), tolerance) << "step " << i;
        if (i == 0) {  // the test has power: the full cache answers otherwise
            full.decode({ next[0] });
            power = rel_diff(full.logits(), want);
            EXPECT_GT(power, std::max(1e-3, 3 * tolerance));
        }
    }
    std::printf("[ info     ] %s: %zu of %d cells kept in every head; logits vs llama.cpp's cache: rel %.2g (the "
                "full cache's %.2g)\n", GetParam().name, cells[0].size(), p.n_cells(), worst, power);
}

// The prompt as the reference forward sees it, cell by cell, from a raw mtmd context of the same projector file and
// model: text cells are the chunks' tokens (1-D positions; t = y = x for M-RoPE), image cells mtmd's embeddings of
// their chunk (n_embd_inp floats each: qwen3vl's deepstack parts included) at mtmd's decoder positions, each chunk
// advancing the next position by its n_pos; an image chunk mtmd decodes non-causally (Gemma 3's) is one block.
struct reference_prompt {
    std::vector<int32_t>  tokens;
    std::vector<position> positions;
    input_embeddings      inputs;
    std::vector<int32_t>  blocks;  // non-causal block per cell (the chunk's index), -1 causal
    llama_pos             n_past     = 0;
    bool                  non_causal = false;  // some image chunk is decoded non-causally

    reference_prompt(const tiny_model & m, const family_fixture & f, const std::string & text) {
        mtmd_context_params pp = mtmd_context_params_default();
        pp.use_gpu             = false;
        pp.warmup              = false;
        pp.print_timings       = false;
        pp.n_threads           = f.options.n_threads;
        const std::unique_ptr<mtmd_context, plain_context::mtmd_free_> ctx(
            mtmd_init_from_file(f.files.mmproj.c_str(), m.get(), pp));
        if (!ctx) {
            throw std::runtime_error("the raw mtmd context could not be made");
        }
        const bitmap_ptr bmp(
            mtmd_helper_bitmap_init_from_file(ctx.get(), f.image.c_str(), false, mtmd_helper_init_opt_default()).bitmap);
        const std::unique_ptr<mtmd_input_chunks, void (*)(mtmd_input_chunks *)> chunks(mtmd_input_chunks_init(),
                                                                                      mtmd_input_chunks_free);
        const mtmd_input_text in{ text.c_str(), text.size(), true, true };
        const mtmd_bitmap *   bitmaps[] = { bmp.get() };
        if (!bmp || mtmd_tokenize(ctx.get(), chunks.get(), &in, bitmaps, 1) != 0) {
            throw std::runtime_error("mtmd_tokenize failed");
        }
        const bool    mrope = mtmd_decode_use_mrope(ctx.get());
        const int32_t n_inp = m.n_embd_inp();
        for (size_t i = 0; i < mtmd_input_chunks_size(chunks.get()); ++i) {
            const mtmd_input_chunk * c = mtmd_input_chunks_get(chunks.get(), i);
            if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
                size_t              n   = 0;
                const llama_token * tok = mtmd_input_chunk_get_tokens_text(c, &n);
                for (size_t t = 0; t < n; ++t) {
                    const int32_t pos = n_past + int32_t(t);
                    tokens.push_back(tok[t]);
                    positions.push_back({ pos, pos, pos });
                    inputs.emplace_back();
                    blocks.push_back(-1);
                }
                n_past += llama_pos(n);
                continue;
            }
            if (mtmd_encode_chunk(ctx.get(), c) != 0) {
                throw std::runtime_error("mtmd_encode_chunk failed");
            }
            const float *             e     = mtmd_get_output_embd(ctx.get());
            const mtmd_image_tokens * image = mtmd_input_chunk_get_tokens_image(c);
            const bool                nc    = mtmd_decode_use_non_causal(ctx.get(), c);
            non_causal |= nc;
            for (size_t t = 0; t < mtmd_input_chunk_get_n_tokens(c); ++t) {
                tokens.push_back(0);  // not read: the cell is its embedding
                if (mrope) {          // (t0, t0 + row, t0 + col), as mtmd-helper sends them
                    const mtmd_decoder_pos d = mtmd_image_tokens_get_decoder_pos(image, n_past, t);
                    positions.push_back({ int32_t(d.t), int32_t(d.y), int32_t(d.x) });
                } else {
                    const int32_t pos = n_past + int32_t(t);
                    positions.push_back({ pos, pos, pos });
                }
                inputs.emplace_back(e + t * size_t(n_inp), e + (t + 1) * size_t(n_inp));
                blocks.push_back(nc ? int32_t(i) : -1);
            }
            n_past += mtmd_input_chunk_get_n_pos(c);
        }
    }

    void append_text(int32_t token) {
        tokens.push_back(token);
        positions.push_back({ n_past, n_past, n_past });
        inputs.emplace_back();
        blocks.push_back(-1);
        ++n_past;
    }
};

// A selection with its own count per KV head (AdaKV) on the image prompt: the compressed cache's logits, step by step,
// are the reference forward's (tiny-model.h, plain C++ in double) with each head's dropped prompt cells masked, on the
// weights of the model file (the same config makes the same weights) and mtmd's own image embeddings and positions.
// The session loads the files (a session on a borrowed llama_model has no projector); the full cache's prompt logits
// checked against the unmasked reference first show both see the same prompt.
TEST_P(family_test, a_per_head_selection_on_an_image_prompt_is_the_masked_reference) {
    const vlm_family &   fam = GetParam();
    const family_fixture f(fam);
    const tiny_model     m = make_tiny_model(vlm_text_config(fam));
    const el::session    s(f.options);
    const el::prompt     p = s.make_prompt(k_prompt, { f.image });
    reference_prompt     ref(m, f, k_prompt);
    ASSERT_EQ(int32_t(ref.tokens.size()), p.n_cells());
    EXPECT_EQ(ref.non_causal, fam.projector == mmproj_type::gemma3);  // mtmd_decode_use_non_causal
    const int32_t n_prompt = p.n_cells();

    const auto                 spec   = ecokv::parse_method("adakv+ecokv");
    const ecokv::method_params params = budget(12, 2);
    const std::vector<llama_token> next = { 40, 41, 120, 7, 255 };
    el::sequence full = s.prefill(p, 16, ecokv::requirements(spec, params));
    EXPECT_EQ(full.n_past(), ref.n_past);
    const double prompt_rel =
        rel_diff(full.logits(), reference_logits(m, ref.tokens, ref.positions, {}, {}, ref.inputs, ref.blocks));
    EXPECT_LT(prompt_rel, logit_rel_tolerance) << "the session's prompt is not the reference's";
    if (ref.non_causal) {  // the blocks matter: the causal reference is another prompt (measured 1.0e-2)
        const double causal_rel =
            rel_diff(full.logits(), reference_logits(m, ref.tokens, ref.positions, {}, {}, ref.inputs));
        EXPECT_GT(causal_rel, 2 * logit_rel_tolerance);
        std::printf("[ info     ] %s: prompt logits vs the reference with a causal image: rel %.3g\n", fam.name,
                    causal_rel);
    }

    el::sequence                            kept  = full.compress(spec, params, 16);
    const std::vector<std::vector<int32_t>> cells = kept.kept_cells();  // before the decodes number theirs
    const int32_t                           n_kv  = m.config().n_head_kv;
    std::vector<int32_t> layer_of;  // model layer -> selection layer; -1: a sliding-window layer, not compressed
    for (int32_t il = 0, i = 0; il < m.config().n_layer; ++il) {
        layer_of.push_back(m.is_swa(il) ? -1 : i++);
    }
    const auto n_global = std::count_if(layer_of.begin(), layer_of.end(), [](int32_t i) { return i >= 0; });
    ASSERT_EQ(int64_t(cells.size()), int64_t(n_global) * n_kv);
    std::set<size_t> counts;
    for (const auto & h : cells) {
        counts.insert(h.size());
        ASSERT_TRUE(std::is_sorted(h.begin(), h.end()));
    }
    ASSERT_GT(counts.size(), 1u) << "expected different budgets per head";
    ASSERT_LT(*counts.rbegin(), size_t(n_prompt));
    auto keep = [&](int32_t il, int32_t g, int32_t qi, int32_t kj) {
        if (qi < n_prompt || kj >= n_prompt || layer_of[size_t(il)] < 0) {
            return true;  // a sliding-window layer sees its window, as in llama.cpp (the reference masks it)
        }
        const auto & h = cells[size_t(layer_of[size_t(il)]) * size_t(n_kv) + size_t(g)];
        return std::binary_search(h.begin(), h.end(), kj);
    };

    double worst = 0, least_power = INFINITY;
    for (size_t i = 0; i < next.size(); ++i) {
        kept.decode({ next[i] });
        ref.append_text(next[i]);
        const std::vector<float> want = reference_logits(m, ref.tokens, ref.positions, keep, {}, ref.inputs, ref.blocks);
        const std::vector<float> unmasked =
            reference_logits(m, ref.tokens, ref.positions, {}, {}, ref.inputs, ref.blocks);
        const double rel = rel_diff(kept.logits(), want), power = rel_diff(kept.logits(), unmasked);
        EXPECT_LT(rel, logit_rel_tolerance) << "step " << i;
        EXPECT_GT(power, 3 * logit_rel_tolerance) << "step " << i << ": the unmasked reference answers as well";
        worst       = std::max(worst, rel);
        least_power = std::min(least_power, power);
    }
    EXPECT_EQ(kept.n_past(), ref.n_past);
    std::printf("[ info     ] %s: %zu..%zu of %d cells kept per head; prompt logits vs reference rel %.2g, decode vs "
                "masked reference rel %.2g (unmasked %.2g)\n",
                fam.name, *counts.begin(), *counts.rbegin(), n_prompt, prompt_rel, worst, least_power);
}

// Each family's chat template (llama.cpp's built-in rendering of it) puts the question where ecokv splits the prompt:
// the context (compressed before any question) is the user turn up to the question, the suffix closes the turn and
// opens the assistant's, as the family's format writes them (counted by hand from the published templates).
TEST_P(family_test, the_chat_template_splits_where_the_question_goes) {
    const family_fixture f(GetParam());
    const el::session    s(f.options);
    const std::string    name = GetParam().name;
    const std::map<std::string, std::pair<std::string, std::string>> want = {  // context prefix, question suffix
        { "llava-1.5", { "USER: ", "\nASSISTANT:" } },
        { "llava-next", { "USER: ", "\nASSISTANT:" } },
        { "gemma-3", { "<start_of_turn>user\n", "<end_of_turn>\n<start_of_turn>model\n" } },
        { "smolvlm", { "<|im_start|>User: ", "<end_of_utterance>\nAssistant:" } },
    };
    const auto it       = want.find(name);
    const auto expected = it != want.end() ? it->second
                                           : std::pair<std::string, std::string>{ "<|im_start|>user\n",
                                                                                  "<|im_end|>\n<|im_start|>assistant\n" };
    const el::prompt_parts parts = s.split_prompt(k_prompt);
    EXPECT_EQ(parts.context, expected.first + k_prompt + "\n");
    EXPECT_EQ(parts.question_suffix, expected.second);
    // the context with its image is a prompt of the family's layout, the image's cells as hand-counted
    const el::prompt p = s.make_prompt(parts.context, { f.image });
    int32_t n_image = 0;
    for (const span & x : hand_counted(name)) {
        n_image += x.image ? x.n : 0;
    }
    EXPECT_EQ(p.n_media(), n_image);
}

// An image's unit (what two prompts compare to share a cached prefix) is the first 8 bytes of the SHA-256 of its
// bytes (here coreutils' sha256sum), the top bit set to mark an image; an image of several chunks names each apart
// (the_methods_see_the_families_layout). Another image of the same size gets another unit.
TEST_P(family_test, an_image_is_named_by_the_sha256_of_its_bytes) {
    const family_fixture f(GetParam());
    const std::string    other = f.dir / "other.ppm";
    write_test_ppm(other, k_width, k_height, 6);
    const el::session s(f.options);
    const el::prompt  p = s.make_prompt(k_prompt, { f.image }), q = s.make_prompt(k_prompt, { other });
    EXPECT_NE(p.units(), q.units());
    if (p.images().size() != 1) {
        return;
    }
    FILE * pipe = popen(("sha256sum " + f.image).c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    char hex[17] = {};
    ASSERT_EQ(fread(hex, 1, 16, pipe), 16u);
    pclose(pipe);
    const uint64_t want = (uint64_t(1) << 63) | std::stoull(hex, nullptr, 16);
    EXPECT_EQ(std::count(p.units().begin(), p.units().end(), want), 1);
}

INSTANTIATE_TEST_SUITE_P(families, family_test, ::testing::ValuesIn(vlm_families()), [](const auto & info) {
    std::string n = info.param.name;
    std::replace(n.begin(), n.end(), '-', '_');
    std::replace(n.begin(), n.end(), '.', '_');
    return n;
});

}  // namespace
