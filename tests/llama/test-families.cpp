// Every VLM family ecokv runs (tiny-mmproj.h vlm_families(): LLaVA-1.5, Qwen2-VL, LLaVA-NeXT, Qwen2.5-VL, InternVL3,
// SmolVLM, Gemma 3, Qwen3-VL), loaded from GGUF files through libmtmd as ecokv run loads them, with one image prompt:
//   - the modality map the methods see is the family's layout, counted by hand (text markers, tiles, overview);
//   - a covering budget answers exactly as the uncompressed cache;
//   - a selection that keeps the same cells in every head (StreamingLLM) gives the logits of llama.cpp's own cache
//     with the dropped cells removed by llama_memory_seq_rm (positions kept): an independent reference through
//     llama.cpp's and mtmd's public API only.
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

#include <map>
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
TEST_P(family_test, a_head_uniform_selection_is_llama_cpps_cache_without_the_dropped_cells) {
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
    double                         worst = 0;
    for (size_t i = 0; i < next.size(); ++i) {
        const std::vector<float> want = el::decode(ref.ctx.get(), { next[i] }, pos++);
        kept.decode({ next[i] });
        worst = std::max(worst, rel_diff(kept.logits(), want));
        EXPECT_LT(rel_diff(kept.logits(), want), 1e-5) << "step " << i;
        if (i == 0) {  // the test has power: the full cache answers otherwise
            full.decode({ next[0] });
            EXPECT_GT(rel_diff(full.logits(), want), 1e-3);
        }
    }
    std::printf("[ info     ] %s: %zu of %d cells kept in every head; logits vs llama.cpp's cache: rel %.2g\n",
                GetParam().name, cells[0].size(), p.n_cells(), worst);
}

INSTANTIATE_TEST_SUITE_P(families, family_test, ::testing::ValuesIn(vlm_families()), [](const auto & info) {
    std::string n = info.param.name;
    std::replace(n.begin(), n.end(), '-', '_');
    std::replace(n.begin(), n.end(), '.', '_');
    return n;
});

}  // namespace
