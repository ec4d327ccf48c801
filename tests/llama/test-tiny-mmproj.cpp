// Validates tests/llama/tiny-mmproj.{h,cpp}: the random-weight mmproj files load in llama.cpp 0.5.0's libmtmd, pair
// with tiny_model text models (qwen2vl_merger + arch qwen2vl, LLaVA-1.5 mlp + arch llama), and run end to end
// (mtmd_tokenize -> mtmd_helper_eval_chunks -> llama KV cache) with the positions mtmd promises; bad files fail
// cleanly (nullptr, no crash).
#include "tiny-mmproj.h"
#include "tiny-model.h"

#include "llama.h"
#include "mtmd-helper.h"
#include "mtmd.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace t = ecokv::test;

namespace {

// ---- logging: silent, but ERROR lines are kept so tests can assert on them -----------------------------------

std::mutex  g_log_mutex;
std::string g_errors;

void capture_log(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        std::lock_guard<std::mutex> lock(g_log_mutex);
        g_errors += text;
    }
    if (std::getenv("ECOKV_TEST_VERBOSE")) {
        std::fputs(text, stderr);
    }
}

std::string take_errors() {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    return std::exchange(g_errors, {});
}

struct quiet_env : ::testing::Environment {
    void SetUp() override {
        llama_log_set(capture_log, nullptr);
        mtmd_helper_log_set(capture_log, nullptr);  // also calls mtmd_log_set (clip + mtmd)
    }
};

[[maybe_unused]] ::testing::Environment * const g_env = ::testing::AddGlobalTestEnvironment(new quiet_env);

// ---- RAII --------------------------------------------------------------------------------------------------------

struct mtmd_deleter {
    void operator()(mtmd_context * c) const { mtmd_free(c); }
};
struct chunks_deleter {
    void operator()(mtmd_input_chunks * c) const { mtmd_input_chunks_free(c); }
};
struct lctx_deleter {
    void operator()(llama_context * c) const { llama_free(c); }
};

using mtmd_ptr   = std::unique_ptr<mtmd_context, mtmd_deleter>;
using chunks_ptr = std::unique_ptr<mtmd_input_chunks, chunks_deleter>;
using lctx_ptr   = std::unique_ptr<llama_context, lctx_deleter>;

mtmd_context_params mtmd_params(int32_t image_min_tokens = -1) {
    mtmd_context_params p = mtmd_context_params_default();
    p.use_gpu             = false;
    p.warmup              = false;  // the first encode reserves the graph for the real image size instead
    p.print_timings       = false;
    p.n_threads           = 2;
    p.image_min_tokens    = image_min_tokens;
    return p;
}

mtmd_ptr init_mtmd(const std::string & path, const llama_model * text_model, int32_t image_min_tokens = -1) {
    return mtmd_ptr(mtmd_init_from_file(path.c_str(), text_model, mtmd_params(image_min_tokens)));
}

lctx_ptr make_lctx(const t::tiny_model & m) {
    llama_context_params p = llama_context_default_params();  // n_ctx 512, n_batch 2048
    p.n_threads            = 2;
    p.n_threads_batch      = 2;
    lctx_ptr c(llama_init_from_model(m.get(), p));
    if (!c) {
        throw std::runtime_error("llama_init_from_model failed");
    }
    return c;
}

// mtmd_tokenize(prompt with one marker per bitmap); returns the rc and fills `out`.
int32_t tokenize(mtmd_context * ctx, const std::string & prompt, const std::vector<const mtmd_bitmap *> & bitmaps,
                 chunks_ptr & out) {
    out.reset(mtmd_input_chunks_init());
    mtmd_input_text text{};
    text.text          = prompt.c_str();
    text.text_len      = prompt.size();  // required: mtmd copies exactly text_len bytes (no strlen)
    text.add_special   = true;
    text.parse_special = true;
    return mtmd_tokenize(ctx, out.get(), &text, bitmaps.data(), bitmaps.size());
}

std::string media_prompt(int n_images) {
    const std::string m = mtmd_default_marker();
    if (n_images == 1) {
        return "describe " + m + " please";
    }
    return "first " + m + " then " + m + " please";
}

std::vector<llama_token> tokenize_text(const llama_model * model, const std::string & s) {
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::vector<llama_token> out(s.size() + 8);
    const int32_t n = llama_tokenize(vocab, s.data(), int32_t(s.size()), out.data(), int32_t(out.size()),
                                     /*add_special*/ false, /*parse_special*/ true);
    if (n < 0) {
        throw std::runtime_error("llama_tokenize failed");
    }
    out.resize(size_t(n));
    return out;
}

std::vector<llama_token> concat(std::vector<llama_token> a, const std::vector<llama_token> & b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

std::vector<llama_token> chunk_text(const mtmd_input_chunk * c) {
    size_t              n   = 0;
    const llama_token * tok = mtmd_input_chunk_get_tokens_text(c, &n);
    return std::vector<llama_token>(tok, tok + n);
}

std::vector<float> last_logits(llama_context * ctx, const t::tiny_model & m) {
    const float * l = llama_get_logits_ith(ctx, -1);
    if (!l) {
        throw std::runtime_error("no logits");
    }
    return std::vector<float>(l, l + m.config().n_vocab);
}

bool all_finite(const std::vector<float> & v) {
    for (float x : v) {
        if (!std::isfinite(x)) {
            return false;
        }
    }
    return true;
}

double max_abs_diff(const std::vector<float> & a, const std::vector<float> & b) {
    double d = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        d = std::max(d, double(std::fabs(a[i] - b[i])));
    }
    return a.size() == b.size() ? d : INFINITY;
}

// Encodes one image chunk and copies the embeddings (n_tokens x n_embd_text).
std::vector<float> encode_image(mtmd_context * ctx, const mtmd_input_chunk * chunk, int32_t n_embd) {
    if (mtmd_encode_chunk(ctx, chunk) != 0) {
        throw std::runtime_error("mtmd_encode_chunk failed");
    }
    const float * e = mtmd_get_output_embd(ctx);
    return std::vector<float>(e, e + mtmd_input_chunk_get_n_tokens(chunk) * size_t(n_embd));
}

double stddev(const std::vector<float> & v) {
    double s = 0, s2 = 0;
    for (float x : v) {
        s += x;
        s2 += double(x) * x;
    }
    const double n = double(v.size());
    return std::sqrt(std::max(0.0, s2 / n - (s / n) * (s / n)));
}

t::tiny_config text_config(const std::string & arch, int32_t n_embd = 64) {
    t::tiny_config c;
    c.arch      = arch;
    c.n_layer   = 2;
    c.n_embd    = n_embd;
    c.n_head    = 4;
    c.n_head_kv = 2;
    c.n_ff      = 128;
    c.n_vocab   = 128;
    c.seed      = 7;
    return c;
}

t::tiny_mmproj_config mmproj_config(t::mmproj_type type, int32_t n_embd_text = 64) {
    t::tiny_mmproj_config c;
    c.type        = type;
    c.image_size  = 56;
    c.patch_size  = 14;
    c.n_embd      = 32;
    c.n_block     = 1;
    c.n_head      = 2;
    c.n_ff        = 64;
    c.n_embd_text = n_embd_text;
    c.seed        = 11;
    return c;
}

std::string first_line(const std::string & s) {
    return s.substr(0, s.find('\n'));
}

std::vector<char> read_file(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string & path, const char * data, size_t n) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(data, std::streamsize(n));
}

// Evaluates the chunks one at a time with mtmd_helper_eval_chunk_single and checks, after every chunk, the n_past it
// returns and llama_memory_seq_pos_max against what the chunk list says. M-RoPE images put every cell at t = pos0
// (the x / y planes carry the 2-D offsets), so after an image chunk seq_pos_max = pos0 while n_past = pos0 + n_pos.
llama_pos eval_and_check_positions(mtmd_context * mctx, llama_context * lctx, const mtmd_input_chunks * chunks,
                                   bool mrope) {
    llama_memory_t mem    = llama_get_memory(lctx);
    llama_pos      n_past = 0;
    const size_t   n      = mtmd_input_chunks_size(chunks);
    for (size_t i = 0; i < n; ++i) {
        const mtmd_input_chunk * c     = mtmd_input_chunks_get(chunks, i);
        const bool               image = mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_IMAGE;
        const llama_pos          pos0  = n_past;
        llama_pos new_n_past = n_past;  // quirk: the text path *adds* to *new_n_past, so it must start at n_past
        const int32_t rc = mtmd_helper_eval_chunk_single(mctx, lctx, c, n_past, 0, 512, i + 1 == n, &new_n_past);
        EXPECT_EQ(rc, 0) << "chunk " << i << ": " << take_errors();
        EXPECT_EQ(new_n_past, pos0 + mtmd_input_chunk_get_n_pos(c)) << "chunk " << i;
        const llama_pos expected_max = image && mrope ? pos0 : new_n_past - 1;
        EXPECT_EQ(llama_memory_seq_pos_max(mem, 0), expected_max) << "chunk " << i;
        EXPECT_EQ(llama_memory_seq_pos_min(mem, 0), 0) << "chunk " << i;
        n_past = new_n_past;
    }
    return n_past;
}

}  // namespace

// ---- the generators themselves -----------------------------------------------------------------------------------

TEST(TinyMmproj, FilesAreSmallAndDeterministic) {
    for (auto type : { t::mmproj_type::qwen2vl_merger, t::mmproj_type::llava_mlp }) {
        SCOPED_TRACE(t::mmproj_type_name(type));
        auto c = mmproj_config(type);
        const auto f1 = t::write_tiny_mmproj_temp(c);
        const auto f2 = t::write_tiny_mmproj_temp(c);
        c.seed        = 12;
        const auto f3 = t::write_tiny_mmproj_temp(c);
        const auto b1 = read_file(f1->path()), b2 = read_file(f2->path()), b3 = read_file(f3->path());
        EXPECT_GT(b1.size(), 1000u);
        EXPECT_LT(b1.size(), 2u << 20);
        EXPECT_EQ(b1, b2);  // same config -> same bytes
        EXPECT_EQ(b1.size(), b3.size());
        EXPECT_NE(b1, b3);  // another seed -> other weights
        std::printf("[ info     ] %s mmproj: %zu bytes, %zu tensors\n", t::mmproj_type_name(type), b1.size(),
                    t::tiny_mmproj_tensor_names(mmproj_config(type)).size());
    }
}

TEST(TinyMmproj, RejectsBadConfigs) {
    auto c = mmproj_config(t::mmproj_type::qwen2vl_merger);
    c.n_ff = c.n_embd;  // would be taken for a legacy file with swapped ffn_up/down
    EXPECT_THROW(t::write_tiny_mmproj(t::temp_gguf_path(), c), std::invalid_argument);
    c        = mmproj_config(t::mmproj_type::qwen2vl_merger);
    c.n_embd = 36;
    c.n_head = 3;  // head dim 12 is a multiple of 4: fine
    EXPECT_NO_THROW(t::tiny_mmproj_tensor_names(c));
    c.n_head = 6;  // head dim 6: vision M-RoPE needs a multiple of 4
    EXPECT_THROW(t::tiny_mmproj_tensor_names(c), std::invalid_argument);
}

TEST(TinyMmproj, TestImage) {
    const auto a = t::make_test_image_rgb(37, 23, 5);
    EXPECT_EQ(a.size(), size_t(37 * 23 * 3));
    EXPECT_EQ(a, t::make_test_image_rgb(37, 23, 5));
    EXPECT_NE(a, t::make_test_image_rgb(37, 23, 6));
    int lo = 255, hi = 0;
    for (uint8_t v : a) {
        lo = std::min<int>(lo, v);
        hi = std::max<int>(hi, v);
    }
    EXPECT_GT(hi - lo, 100);  // not flat

    const t::bitmap_ptr b = t::make_test_bitmap(37, 23, 5);
    ASSERT_TRUE(b);
    EXPECT_EQ(mtmd_bitmap_get_nx(b.get()), 37u);
    EXPECT_EQ(mtmd_bitmap_get_ny(b.get()), 23u);
    ASSERT_EQ(mtmd_bitmap_get_n_bytes(b.get()), a.size());
    EXPECT_EQ(std::memcmp(mtmd_bitmap_get_data(b.get()), a.data(), a.size()), 0);
    EXPECT_FALSE(mtmd_bitmap_is_audio(b.get()));
}

// ---- Qwen2-VL merger + qwen2vl text model ------------------------------------------------------------------------

TEST(TinyMmprojQwen2vl, EndToEnd) {
    const t::tiny_model m  = t::make_tiny_model(text_config("qwen2vl"));
    const auto          mc = mmproj_config(t::mmproj_type::qwen2vl_merger, m.config().n_embd);
    const auto          f  = t::write_tiny_mmproj_temp(mc);

    mtmd_ptr ctx = init_mtmd(f->path(), m.get());
    ASSERT_TRUE(ctx) << take_errors();
    EXPECT_TRUE(mtmd_support_vision(ctx.get()));
    EXPECT_FALSE(mtmd_support_audio(ctx.get()));
    EXPECT_TRUE(mtmd_decode_use_mrope(ctx.get()));
    EXPECT_FALSE(mtmd_decode_use_non_causal(ctx.get(), nullptr));

    // 112x84 is already a multiple of 28 (patch 14 x merge 2) and >= 8 merged tokens: 8x6 patches -> 4x3 tokens
    const int32_t  nx = 112, ny = 84;
    const auto     geo = t::expected_image_geometry(mc, nx, ny);
    ASSERT_EQ(geo.tokens_x, 4);
    ASSERT_EQ(geo.tokens_y, 3);
    const t::bitmap_ptr bmp = t::make_test_bitmap(nx, ny, 3);

    chunks_ptr chunks;
    ASSERT_EQ(tokenize(ctx.get(), media_prompt(1), { bmp.get() }, chunks), 0) << take_errors();
    ASSERT_EQ(mtmd_input_chunks_size(chunks.get()), 3u);
    const mtmd_input_chunk * c0 = mtmd_input_chunks_get(chunks.get(), 0);
    const mtmd_input_chunk * c1 = mtmd_input_chunks_get(chunks.get(), 1);
    const mtmd_input_chunk * c2 = mtmd_input_chunks_get(chunks.get(), 2);
    ASSERT_EQ(mtmd_input_chunk_get_type(c0), MTMD_INPUT_CHUNK_TYPE_TEXT);
    ASSERT_EQ(mtmd_input_chunk_get_type(c1), MTMD_INPUT_CHUNK_TYPE_IMAGE);
    ASSERT_EQ(mtmd_input_chunk_get_type(c2), MTMD_INPUT_CHUNK_TYPE_TEXT);

    // mtmd wraps Qwen2-VL images in "<|vision_start|>" / "<|vision_end|>", tokenized as plain text by the dummy
    // "test" vocab (5-byte chunks hashed to ids), each piece separately
    EXPECT_EQ(chunk_text(c0), concat(tokenize_text(m.get(), "describe "), tokenize_text(m.get(), "<|vision_start|>")));
    EXPECT_EQ(chunk_text(c2), concat(tokenize_text(m.get(), "<|vision_end|>"), tokenize_text(m.get(), " please")));
    const llama_pos n0 = llama_pos(mtmd_input_chunk_get_n_tokens(c0));
    const llama_pos n2 = llama_pos(mtmd_input_chunk_get_n_tokens(c2));
    EXPECT_EQ(mtmd_input_chunk_get_n_pos(c0), n0);

    const mtmd_image_tokens * img = mtmd_input_chunk_get_tokens_image(c1);
    ASSERT_NE(img, nullptr);
    EXPECT_EQ(mtmd_input_chunk_get_n_tokens(c1), size_t(geo.n_tokens));  // 12
    EXPECT_EQ(mtmd_input_chunk_get_n_pos(c1), geo.n_pos);                 // 4 = max(4, 3)
    EXPECT_LT(mtmd_input_chunk_get_n_pos(c1), llama_pos(mtmd_input_chunk_get_n_tokens(c1)));
    for (size_t i = 0; i < size_t(geo.n_tokens); ++i) {
        const mtmd_decoder_pos p = mtmd_image_tokens_get_decoder_pos(img, n0, i);
        EXPECT_EQ(p.t, uint32_t(n0));
        EXPECT_EQ(p.x, uint32_t(n0 + int32_t(i) % geo.tokens_x));
        EXPECT_EQ(p.y, uint32_t(n0 + int32_t(i) / geo.tokens_x));
    }
    EXPECT_EQ(mtmd_helper_get_n_tokens(chunks.get()), size_t(n0 + geo.n_tokens + n2));
    EXPECT_EQ(mtmd_helper_get_n_pos(chunks.get()), n0 + geo.n_pos + n2);
    std::printf("[ info     ] qwen2vl %dx%d image: chunks text %d / image %zu tokens (%d x %d), n_pos %d / text %d\n",
                nx, ny, n0, mtmd_input_chunk_get_n_tokens(c1), geo.tokens_x, geo.tokens_y,
                mtmd_input_chunk_get_n_pos(c1), n2);

    // the projector output: n_tokens x n_embd_text, finite, non-degenerate, deterministic, image-dependent
    const std::vector<float> e1 = encode_image(ctx.get(), c1, m.config().n_embd);
    ASSERT_EQ(e1.size(), size_t(geo.n_tokens * m.config().n_embd));
    EXPECT_TRUE(all_finite(e1));
    EXPECT_GT(stddev(e1), 0.05);
    EXPECT_EQ(e1, encode_image(ctx.get(), c1, m.config().n_embd));

    // chunk by chunk: n_past and the cache's max position after every chunk
    lctx_ptr        lctx   = make_lctx(m);
    const llama_pos n_past = eval_and_check_positions(ctx.get(), lctx.get(), chunks.get(), /*mrope*/ true);
    EXPECT_EQ(n_past, n0 + geo.n_pos + n2);
    const std::vector<float> logits_single = last_logits(lctx.get(), m);
    EXPECT_TRUE(all_finite(logits_single));

    // the whole list through mtmd_helper_eval_chunks on a cleared cache: same n_past, same logits
    llama_memory_clear(llama_get_memory(lctx.get()), true);
    llama_pos new_n_past = -1;
    ASSERT_EQ(mtmd_helper_eval_chunks(ctx.get(), lctx.get(), chunks.get(), 0, 0, 512, true, &new_n_past), 0)
        << take_errors();
    EXPECT_EQ(new_n_past, n0 + geo.n_pos + n2);
    EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(lctx.get()), 0), new_n_past - 1);
    EXPECT_LE(max_abs_diff(last_logits(lctx.get(), m), logits_single), 1e-5);
}

TEST(TinyMmprojQwen2vl, TwoImagesAdvancePositionsByMaxSide) {
    const t::tiny_model m  = t::make_tiny_model(text_config("qwen2vl"));
    const auto          mc = mmproj_config(t::mmproj_type::qwen2vl_merger, m.config().n_embd);
    const auto          f  = t::write_tiny_mmproj_temp(mc);
    mtmd_ptr            ctx = init_mtmd(f->path(), m.get());
    ASSERT_TRUE(ctx) << take_errors();

    const t::bitmap_ptr a = t::make_test_bitmap(84, 168, 1);  // 3 x 6 tokens, n_pos 6
    const t::bitmap_ptr b = t::make_test_bitmap(140, 56, 2);  // 5 x 2 tokens, n_pos 5
    chunks_ptr          chunks;
    ASSERT_EQ(tokenize(ctx.get(), media_prompt(2), { a.get(), b.get() }, chunks), 0) << take_errors();
    ASSERT_EQ(mtmd_input_chunks_size(chunks.get()), 5u);
    const int32_t expect_tokens[] = { -1, 18, -1, 10, -1 };
    const int32_t expect_pos[]    = { -1, 6, -1, 5, -1 };
    llama_pos     n_pos_sum       = 0;
    for (size_t i = 0; i < 5; ++i) {
        const mtmd_input_chunk * c = mtmd_input_chunks_get(chunks.get(), i);
        ASSERT_EQ(mtmd_input_chunk_get_type(c), i % 2 ? MTMD_INPUT_CHUNK_TYPE_IMAGE : MTMD_INPUT_CHUNK_TYPE_TEXT);
        if (i % 2) {
            EXPECT_EQ(mtmd_input_chunk_get_n_tokens(c), size_t(expect_tokens[i]));
            EXPECT_EQ(mtmd_input_chunk_get_n_pos(c), expect_pos[i]);
        }
        n_pos_sum += mtmd_input_chunk_get_n_pos(c);
    }
    lctx_ptr lctx = make_lctx(m);
    EXPECT_EQ(eval_and_check_positions(ctx.get(), lctx.get(), chunks.get(), true), n_pos_sum);
    EXPECT_TRUE(all_finite(last_logits(lctx.get(), m)));
}

// mtmd's dynamic resizing (rounding to multiples of 28, at least 8 merged tokens) against expected_image_geometry
TEST(TinyMmprojQwen2vl, ImageGeometryMatchesMtmd) {
    const t::tiny_model m  = t::make_tiny_model(text_config("qwen2vl"));
    const auto          mc = mmproj_config(t::mmproj_type::qwen2vl_merger, m.config().n_embd);
    const auto          f  = t::write_tiny_mmproj_temp(mc);

    struct tc {
        int32_t nx, ny, min_tokens, tx, ty;
    };
    const tc cases[] = {
        { 112, 84, -1, 4, 3 },   // already aligned
        { 100, 70, -1, 4, 3 },   // rounded to 112 x 84
        { 56, 56, -1, 3, 3 },    // 2x2 < 8 tokens: scaled up to 84 x 84
        { 28, 28, -1, 3, 3 },    // 1x1: scaled up to 84 x 84
        { 30, 200, -1, 2, 8 },   // rounds to 1 x 7 = 7 tokens < 8 -> scaled by 1.022 with ceil: 56 x 224
        { 56, 56, 1, 2, 2 },     // image_min_tokens = 1 keeps 2x2
        { 28, 28, 1, 1, 1 },     // a single token: n_pos 1
    };
    for (const auto & k : cases) {
        SCOPED_TRACE(std::to_string(k.nx) + "x" + std::to_string(k.ny) + " min " + std::to_string(k.min_tokens));
        const auto geo = t::expected_image_geometry(mc, k.nx, k.ny, k.min_tokens);
        EXPECT_EQ(geo.tokens_x, k.tx);
        EXPECT_EQ(geo.tokens_y, k.ty);
        mtmd_ptr ctx = init_mtmd(f->path(), m.get(), k.min_tokens);
        ASSERT_TRUE(ctx) << take_errors();
        const t::bitmap_ptr bmp = t::make_test_bitmap(k.nx, k.ny, 9);
        chunks_ptr          chunks;
        ASSERT_EQ(tokenize(ctx.get(), media_prompt(1), { bmp.get() }, chunks), 0) << take_errors();
        const mtmd_input_chunk * c = mtmd_input_chunks_get(chunks.get(), 1);
        ASSERT_EQ(mtmd_input_chunk_get_type(c), MTMD_INPUT_CHUNK_TYPE_IMAGE);
        EXPECT_EQ(mtmd_input_chunk_get_n_tokens(c), size_t(geo.n_tokens));
        EXPECT_EQ(mtmd_input_chunk_get_n_pos(c), geo.n_pos);
        // nx from the decoder positions: token tokens_x is the first of row 1
        const mtmd_image_tokens * img = mtmd_input_chunk_get_tokens_image(c);
        if (geo.n_tokens > geo.tokens_x) {
            const mtmd_decoder_pos p = mtmd_image_tokens_get_decoder_pos(img, 0, size_t(geo.tokens_x));
            EXPECT_EQ(p.x, 0u);
            EXPECT_EQ(p.y, 1u);
        }
        // and it encodes + decodes
        lctx_ptr lctx = make_lctx(m);
        EXPECT_EQ(eval_and_check_positions(ctx.get(), lctx.get(), chunks.get(), true),
                  mtmd_helper_get_n_pos(chunks.get()));
        std::printf("[ info     ] qwen2vl %3dx%-3d (min_tokens %2d) -> %3dx%-3d px, %d x %d = %2d tokens, n_pos %d\n",
                    k.nx, k.ny, k.min_tokens, geo.width, geo.height, geo.tokens_x, geo.tokens_y, geo.n_tokens,
                    geo.n_pos);
    }
}

// ---- the other families: tiles (LLaVA-NeXT, InternVL, Idefics3), Qwen2.5-VL's window attention ------------------

struct family_case {
    const char *   name;
    t::mmproj_type type;
    const char *   arch;
    bool           mrope;
};

class TinyMmprojFamily : public ::testing::TestWithParam<family_case> {};

// The image chunks mtmd makes (count, tokens, grid) are those expected_image_layout computes from the preprocessing
// rules, for an image within one tile, a 4:3 one and a wide one; the embeddings are finite and depend on the image.
// A byte-level BPE vocabulary: Idefics3's layout looks "\n", "\n\n" and its image tokens up by their text.
t::tiny_config bpe_config(const std::string & arch) {
    t::tiny_config c = text_config(arch);
    c.tokenizer      = "bpe";
    c.n_vocab        = 300;
    if (arch == "qwen3vl") {
        c.n_deepstack_layers = 1;  // the projector's one deepstack block (tiny_mmproj_config::deepstack_blocks)
    }
    return c;
}

TEST_P(TinyMmprojFamily, ImageChunksAreTheExpectedLayout) {
    const family_case   fc = GetParam();
    const t::tiny_model m  = t::make_tiny_model(bpe_config(fc.arch));
    auto                mc = mmproj_config(fc.type, m.config().n_embd);
    mc.n_block             = 2;
    const auto f           = t::write_tiny_mmproj_temp(mc);
    mtmd_ptr   ctx         = init_mtmd(f->path(), m.get());
    ASSERT_TRUE(ctx) << take_errors();
    EXPECT_EQ(mtmd_decode_use_mrope(ctx.get()), fc.mrope);
    for (const auto & [nx, ny] : { std::pair{ 40, 30 }, std::pair{ 112, 84 }, std::pair{ 200, 60 } }) {
        SCOPED_TRACE(std::to_string(nx) + "x" + std::to_string(ny));
        const t::image_layout want = t::expected_image_layout(mc, nx, ny);
        const t::bitmap_ptr   bmp  = t::make_test_bitmap(nx, ny, 4);
        chunks_ptr            chunks;
        ASSERT_EQ(tokenize(ctx.get(), media_prompt(1), { bmp.get() }, chunks), 0) << take_errors();
        std::vector<const mtmd_input_chunk *> images;
        for (size_t i = 0; i < mtmd_input_chunks_size(chunks.get()); ++i) {
            const mtmd_input_chunk * c = mtmd_input_chunks_get(chunks.get(), i);
            if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_IMAGE) {
                images.push_back(c);
            }
        }
        ASSERT_EQ(images.size(), want.chunks.size());
        for (size_t i = 0; i < images.size(); ++i) {
            const mtmd_image_tokens * it = mtmd_input_chunk_get_tokens_image(images[i]);
            EXPECT_EQ(mtmd_input_chunk_get_n_tokens(images[i]), size_t(want.chunks[i].n_tokens)) << "chunk " << i;
            EXPECT_EQ(mtmd_image_tokens_get_nx(it), size_t(want.chunks[i].tokens_x)) << "chunk " << i;
            EXPECT_EQ(mtmd_image_tokens_get_ny(it), size_t(want.chunks[i].tokens_y)) << "chunk " << i;
            EXPECT_EQ(mtmd_input_chunk_get_n_pos(images[i]), want.chunks[i].n_pos) << "chunk " << i;
        }
        const std::vector<float> e = encode_image(ctx.get(), images.back(), m.config().n_embd);
        EXPECT_TRUE(all_finite(e));
        EXPECT_GT(stddev(e), 0.05);
        std::printf("[ info     ] %s %dx%d: %zu image chunks (%d x %d tiles), %d tokens\n", fc.name, nx, ny,
                    images.size(), want.tiles_x, want.tiles_y, want.n_tokens());
        lctx_ptr  lctx   = make_lctx(m);
        llama_pos n_past = -1;
        ASSERT_EQ(mtmd_helper_eval_chunks(ctx.get(), lctx.get(), chunks.get(), 0, 0, 512, true, &n_past), 0)
            << take_errors();
        EXPECT_TRUE(all_finite(last_logits(lctx.get(), m)));
    }
}

// Idefics3's prompt, counted by hand: each tile after "<fake_token_around_image><row_Y_col_X>" (13 bytes, one token
// each in this vocabulary), "\n" after every row but the last, then "\n\n<fake_token_around_image><global-img>", the
// overview, "<fake_token_around_image>". 112x84 is 3 x 2 tiles of 4 tokens (expected_image_layout).
TEST(TinyMmprojIdefics3, TextAroundTheTilesIsTheModelsLayout) {
    const t::tiny_model m  = t::make_tiny_model(bpe_config("llama"));
    const auto          mc = mmproj_config(t::mmproj_type::idefics3, m.config().n_embd);
    const auto          f  = t::write_tiny_mmproj_temp(mc);
    mtmd_ptr            ctx = init_mtmd(f->path(), m.get());
    ASSERT_TRUE(ctx) << take_errors();
    const t::bitmap_ptr bmp = t::make_test_bitmap(112, 84, 4);
    chunks_ptr          chunks;
    ASSERT_EQ(tokenize(ctx.get(), media_prompt(1), { bmp.get() }, chunks), 0) << take_errors();
    std::vector<std::pair<bool, size_t>> got;  // (image, tokens) per chunk
    for (size_t i = 0; i < mtmd_input_chunks_size(chunks.get()); ++i) {
        const mtmd_input_chunk * c = mtmd_input_chunks_get(chunks.get(), i);
        got.emplace_back(mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_IMAGE, mtmd_input_chunk_get_n_tokens(c));
    }
    const size_t describe = 9, fake = 1, row_col = 13, newline = 1, please = 7;
    const std::vector<std::pair<bool, size_t>> want = {
        { false, describe + fake + row_col }, { true, 4 }, { false, fake + row_col }, { true, 4 },
        { false, fake + row_col },            { true, 4 }, { false, newline + fake + row_col }, { true, 4 },
        { false, fake + row_col },            { true, 4 }, { false, fake + row_col }, { true, 4 },
        { false, 3 },                         { true, 4 }, { false, fake + please },
    };
    EXPECT_EQ(got, want);
    const std::vector<llama_token> tail = chunk_text(mtmd_input_chunks_get(chunks.get(), got.size() - 3));
    EXPECT_EQ(tail, tokenize_text(m.get(), "\n\n<fake_token_around_image><global-img>"));
    EXPECT_EQ(tail.size(), 3u);
}

INSTANTIATE_TEST_SUITE_P(Families, TinyMmprojFamily,
                         ::testing::Values(family_case{ "llava_next", t::mmproj_type::llava_next, "llama", false },
                                           family_case{ "qwen25vl", t::mmproj_type::qwen25vl_merger, "qwen2vl", true },
                                           family_case{ "internvl", t::mmproj_type::internvl, "qwen2", false },
                                           family_case{ "idefics3", t::mmproj_type::idefics3, "llama", false },
                                           family_case{ "gemma3", t::mmproj_type::gemma3, "gemma3", false },
                                           family_case{ "qwen3vl", t::mmproj_type::qwen3vl_merger, "qwen3vl", true }),
                         [](const auto & info) { return std::string(info.param.name); });

// ---- LLaVA-1.5 mlp + llama text model ----------------------------------------------------------------------------

class TinyMmprojLlava : public ::testing::TestWithParam<int32_t> {};  // param: n_block

TEST_P(TinyMmprojLlava, EndToEnd) {
    const t::tiny_model m  = t::make_tiny_model(text_config("llama"));
    auto                mc = mmproj_config(t::mmproj_type::llava_mlp, m.config().n_embd);
    mc.n_block             = GetParam();
    const auto f           = t::write_tiny_mmproj_temp(mc);

    mtmd_ptr ctx = init_mtmd(f->path(), m.get());
    ASSERT_TRUE(ctx) << take_errors();
    EXPECT_TRUE(mtmd_support_vision(ctx.get()));
    EXPECT_FALSE(mtmd_decode_use_mrope(ctx.get()));

    // any input size is resized to image_size^2 = 56x56: 4x4 patches = 16 tokens, 1-D positions
    const int32_t nx = 80, ny = 60;
    const auto    geo = t::expected_image_geometry(mc, nx, ny);
    ASSERT_EQ(geo.n_tokens, 16);
    const t::bitmap_ptr bmp = t::make_test_bitmap(nx, ny, 4);

    chunks_ptr chunks;
    ASSERT_EQ(tokenize(ctx.get(), media_prompt(1), { bmp.get() }, chunks), 0) << take_errors();
    ASSERT_EQ(mtmd_input_chunks_size(chunks.get()), 3u);
    const mtmd_input_chunk * c0 = mtmd_input_chunks_get(chunks.get(), 0);
    const mtmd_input_chunk * c1 = mtmd_input_chunks_get(chunks.get(), 1);
    const mtmd_input_chunk * c2 = mtmd_input_chunks_get(chunks.get(), 2);
    ASSERT_EQ(mtmd_input_chunk_get_type(c0), MTMD_INPUT_CHUNK_TYPE_TEXT);
    ASSERT_EQ(mtmd_input_chunk_get_type(c1), MTMD_INPUT_CHUNK_TYPE_IMAGE);
    ASSERT_EQ(mtmd_input_chunk_get_type(c2), MTMD_INPUT_CHUNK_TYPE_TEXT);
    // no image begin/end markers for LLaVA-1.5; the dummy vocab has no BOS
    EXPECT_EQ(chunk_text(c0), tokenize_text(m.get(), "describe "));
    EXPECT_EQ(chunk_text(c2), tokenize_text(m.get(), " please"));
    const llama_pos n0 = llama_pos(mtmd_input_chunk_get_n_tokens(c0));
    const llama_pos n2 = llama_pos(mtmd_input_chunk_get_n_tokens(c2));
    EXPECT_EQ(mtmd_input_chunk_get_n_tokens(c1), size_t(geo.n_tokens));
    EXPECT_EQ(mtmd_input_chunk_get_n_pos(c1), geo.n_pos);  // n_pos == n_tokens
    const mtmd_image_tokens * img = mtmd_input_chunk_get_tokens_image(c1);
    for (size_t i = 0; i < size_t(geo.n_tokens); ++i) {
        const mtmd_decoder_pos p = mtmd_image_tokens_get_decoder_pos(img, n0, i);
        EXPECT_EQ(p.t, uint32_t(n0 + int32_t(i)));
    }
    std::printf("[ info     ] llava n_block %d, %dx%d image: chunks text %d / image %zu tokens, n_pos %d / text %d\n",
                mc.n_block, nx, ny, n0, mtmd_input_chunk_get_n_tokens(c1), mtmd_input_chunk_get_n_pos(c1), n2);

    const std::vector<float> e1 = encode_image(ctx.get(), c1, m.config().n_embd);
    EXPECT_TRUE(all_finite(e1));
    EXPECT_GT(stddev(e1), 0.05);
    {  // a different image gives different embeddings
        const t::bitmap_ptr other = t::make_test_bitmap(nx, ny, 5);
        chunks_ptr          ch2;
        ASSERT_EQ(tokenize(ctx.get(), media_prompt(1), { other.get() }, ch2), 0);
        EXPECT_GT(max_abs_diff(encode_image(ctx.get(), mtmd_input_chunks_get(ch2.get(), 1), m.config().n_embd), e1),
                  1e-3);
    }

    lctx_ptr        lctx   = make_lctx(m);
    const llama_pos n_past = eval_and_check_positions(ctx.get(), lctx.get(), chunks.get(), /*mrope*/ false);
    EXPECT_EQ(n_past, n0 + geo.n_tokens + n2);
    const std::vector<float> logits_single = last_logits(lctx.get(), m);
    EXPECT_TRUE(all_finite(logits_single));

    llama_memory_clear(llama_get_memory(lctx.get()), true);
    llama_pos new_n_past = -1;
    ASSERT_EQ(mtmd_helper_eval_chunks(ctx.get(), lctx.get(), chunks.get(), 0, 0, 512, true, &new_n_past), 0)
        << take_errors();
    EXPECT_EQ(new_n_past, n0 + geo.n_tokens + n2);
    EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(lctx.get()), 0), new_n_past - 1);
    EXPECT_LE(max_abs_diff(last_logits(lctx.get(), m), logits_single), 1e-5);
}

// n_block 1: LLaVA takes the penultimate ViT layer, so no block runs (embeddings -> pre_ln -> MLP);
// n_block 2: one ViT block runs.
INSTANTIATE_TEST_SUITE_P(Blocks, TinyMmprojLlava, ::testing::Values(1, 2));

// The tower really depends on the weights: a different seed changes the llava embeddings for the same image.
TEST(TinyMmprojLlavaSeed, SeedChangesEmbeddings) {
    const t::tiny_model m   = t::make_tiny_model(text_config("llama"));
    auto                mc  = mmproj_config(t::mmproj_type::llava_mlp, m.config().n_embd);
    const auto          fa  = t::write_tiny_mmproj_temp(mc);
    mc.seed                 = 99;
    const auto          fb  = t::write_tiny_mmproj_temp(mc);
    mtmd_ptr            ca  = init_mtmd(fa->path(), m.get());
    mtmd_ptr            cb  = init_mtmd(fb->path(), m.get());
    ASSERT_TRUE(ca && cb) << take_errors();
    const t::bitmap_ptr bmp = t::make_test_bitmap(56, 56, 1);
    chunks_ptr          ka, kb;
    ASSERT_EQ(tokenize(ca.get(), media_prompt(1), { bmp.get() }, ka), 0);
    ASSERT_EQ(tokenize(cb.get(), media_prompt(1), { bmp.get() }, kb), 0);
    const auto ea = encode_image(ca.get(), mtmd_input_chunks_get(ka.get(), 1), m.config().n_embd);
    const auto eb = encode_image(cb.get(), mtmd_input_chunks_get(kb.get(), 1), m.config().n_embd);
    EXPECT_GT(max_abs_diff(ea, eb), 1e-2);
}

// mtmd's default is warmup = true: the files work with it too (qwen2vl reserves its graph for a 1288x1288 image,
// 46x46 merged tokens; llava for image_size^2).
TEST(TinyMmproj, WarmupTrueWorks) {
    for (auto type : { t::mmproj_type::qwen2vl_merger, t::mmproj_type::llava_mlp }) {
        SCOPED_TRACE(t::mmproj_type_name(type));
        const char *        arch = type == t::mmproj_type::llava_mlp ? "llama" : "qwen2vl";
        const t::tiny_model m    = t::make_tiny_model(text_config(arch));
        const auto          f = t::write_tiny_mmproj_temp(mmproj_config(type, m.config().n_embd));
        mtmd_context_params p = mtmd_params();
        p.warmup              = true;
        mtmd_ptr ctx(mtmd_init_from_file(f->c_str(), m.get(), p));
        ASSERT_TRUE(ctx) << take_errors();
        const t::bitmap_ptr bmp = t::make_test_bitmap(112, 84, 1);
        chunks_ptr          chunks;
        ASSERT_EQ(tokenize(ctx.get(), media_prompt(1), { bmp.get() }, chunks), 0) << take_errors();
        EXPECT_TRUE(all_finite(encode_image(ctx.get(), mtmd_input_chunks_get(chunks.get(), 1), m.config().n_embd)));
    }
}

// ---- failures are clean -------------------------------------------------------------------------------------------

// Note: mtmd 0.5.0 leaks the already-loaded clip context when it throws on the mismatch (~175 MB per failed init
// here, mostly the ggml_backend_sched), so this test fails under LeakSanitizer; nothing else in this file leaks.
TEST(TinyMmprojErrors, ProjectionDimMismatchFailsInit) {
    struct tc {
        t::mmproj_type type;
        const char *   arch;
    };
    for (const tc k : { tc{ t::mmproj_type::qwen2vl_merger, "qwen2vl" }, tc{ t::mmproj_type::llava_mlp, "llama" } }) {
        SCOPED_TRACE(t::mmproj_type_name(k.type));
        const t::tiny_model m = t::make_tiny_model(text_config(k.arch, 64));
        const auto          f = t::write_tiny_mmproj_temp(mmproj_config(k.type, 48));
        take_errors();
        mtmd_ptr ctx = init_mtmd(f->path(), m.get());
        EXPECT_FALSE(ctx);
        const std::string err = take_errors();
        EXPECT_NE(err.find("mismatch between text model (n_embd = 64) and mmproj (n_embd = 48)"), std::string::npos)
            << err;
        // without a text model mtmd cannot check the width and accepts the file
        mtmd_ptr no_text = init_mtmd(f->path(), nullptr);
        EXPECT_TRUE(no_text) << take_errors();
    }
}

TEST(TinyMmprojErrors, MissingOrCorruptFileReturnsNull) {
    const t::tiny_model m = t::make_tiny_model(text_config("qwen2vl"));

    // missing
    const std::string missing = t::temp_gguf_path("ecokv-missing");
    take_errors();
    EXPECT_FALSE(init_mtmd(missing, m.get()));
    EXPECT_NE(take_errors().find("failed to load"), std::string::npos);

    // empty, garbage, truncated
    const auto                good  = t::write_tiny_mmproj_temp(mmproj_config(t::mmproj_type::qwen2vl_merger));
    const std::vector<char>   bytes = read_file(good->path());
    t::temp_file              bad(t::temp_gguf_path("ecokv-corrupt"));
    std::vector<char>         garbage(4096);
    for (size_t i = 0; i < garbage.size(); ++i) {
        garbage[i] = char((i * 131 + 7) & 0xff);
    }
    struct bad_file {
        std::string       what;
        std::vector<char> data;
        bool              must_fail;
    };
    const std::vector<bad_file> files = {
        { "empty", {}, true },
        { "garbage", garbage, true },
        { "gguf magic only", std::vector<char>(bytes.begin(), bytes.begin() + 8), true },
        { "truncated in metadata", std::vector<char>(bytes.begin(), bytes.begin() + 200), true },
        { "truncated in tensor data", std::vector<char>(bytes.begin(), bytes.begin() + bytes.size() / 2), true },
        // Quirk: gguf_init_from_file(no_alloc) does not check that the data section fits in the file, and clip's
        // load_tensors() never checks the byte count of its last fin.read(), so a file cut inside its *last*
        // tensor loads (that tensor's tail is left as whatever the buffer held). Only "no crash" is required.
        { "last byte missing", std::vector<char>(bytes.begin(), bytes.end() - 1), false },
    };
    for (const auto & f : files) {
        SCOPED_TRACE(f.what);
        write_bytes(bad.path(), f.data.data(), f.data.size());
        mtmd_ptr          ctx = init_mtmd(bad.path(), m.get());
        const std::string err = take_errors();
        if (f.must_fail) {
            EXPECT_FALSE(ctx);
            EXPECT_FALSE(err.empty());
        }
        std::printf("[ info     ] %-24s -> %s\n", f.what.c_str(),
                    ctx ? "loaded" : ("nullptr: " + first_line(err)).c_str());
    }
}

TEST(TinyMmprojErrors, MissingKeysOrTensorsReturnNull) {
    const t::tiny_model m = t::make_tiny_model(text_config("qwen2vl"));
    // Every key the loader requires, and some required tensors. (Tensors the loader treats as optional but the graph
    // dereferences are NOT safe to omit: without v.patch_embd.weight.1 / v.blk.*.attn_{q,k,v}.bias (qwen2vl) or
    // v.position_embd.weight (llava) mtmd_init_from_file succeeds and the first encode (or warmup) segfaults, and
    // without mm.2.weight (llava) clip_n_mmproj_embd() segfaults inside mtmd_init_from_file.)
    const std::vector<std::string> omit = {
        "clip.has_vision_encoder",  // no modality -> "Failed to load CLIP model"
        "clip.projector_type",      // "unknown projector type"
        "clip.vision.image_size",
        "clip.vision.patch_size",
        "clip.vision.embedding_length",
        "clip.vision.feed_forward_length",
        "clip.vision.block_count",
        "clip.vision.projection_dim",
        "clip.vision.attention.head_count",
        "clip.vision.attention.layer_norm_epsilon",
        "clip.vision.image_mean",  // optional for get_arr_f32, but then fails the ">= 3 elements" check
        "clip.vision.image_std",
        "mm.0.weight",  // merger tensors are required for qwen2vl_merger
        "mm.2.bias",
        "v.blk.0.attn_out.weight",  // per-layer: attn_out.weight, ffn_up.weight, ffn_down.weight are required
        "v.blk.0.ffn_up.weight",
    };
    for (const auto & name : omit) {
        SCOPED_TRACE(name);
        auto c = mmproj_config(t::mmproj_type::qwen2vl_merger);
        c.omit = { name };
        const auto f = t::write_tiny_mmproj_temp(c);
        take_errors();
        EXPECT_FALSE(init_mtmd(f->path(), m.get()));
        const std::string err = take_errors();
        EXPECT_FALSE(err.empty());
        std::printf("[ info     ] without %-42s -> %s\n", name.c_str(), first_line(err).c_str());
    }
}

TEST(TinyMmprojErrors, WrongBitmapCountIsAnError) {
    const t::tiny_model m   = t::make_tiny_model(text_config("qwen2vl"));
    const auto          f   = t::write_tiny_mmproj_temp(mmproj_config(t::mmproj_type::qwen2vl_merger));
    mtmd_ptr            ctx = init_mtmd(f->path(), m.get());
    ASSERT_TRUE(ctx);
    const t::bitmap_ptr bmp = t::make_test_bitmap(56, 56, 1);
    chunks_ptr          chunks;
    // mtmd.h documents 1 for a marker/bitmap count mismatch, but in 0.5.0 the tokenizer's constructor throws and
    // mtmd_tokenize returns 2 (the "preprocessing error" code)
    EXPECT_NE(tokenize(ctx.get(), "no marker here", { bmp.get() }, chunks), 0);
    EXPECT_NE(take_errors().find("does not match number of bitmaps"), std::string::npos);
    EXPECT_NE(tokenize(ctx.get(), media_prompt(2), { bmp.get() }, chunks), 0);
    EXPECT_NE(take_errors().find("exceeds number of bitmaps"), std::string::npos);
    // text_len = 0 (e.g. a zero-initialised mtmd_input_text) is an empty prompt, not strlen(text)
    chunks.reset(mtmd_input_chunks_init());
    const std::string  prompt = media_prompt(1);
    mtmd_input_text    text{};
    text.text                     = prompt.c_str();
    const mtmd_bitmap * bitmaps[] = { bmp.get() };
    EXPECT_NE(mtmd_tokenize(ctx.get(), chunks.get(), &text, bitmaps, 1), 0);
    take_errors();
}
