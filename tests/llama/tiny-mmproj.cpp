#include "tiny-mmproj.h"

#include "seeded-random.h"
#include "tiny-model.h"

#include "ggml.h"
#include "gguf.h"
#include "mtmd.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <fstream>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <system_error>
#include <unistd.h>

namespace ecokv::test {

namespace {


// ---- tensor plan -----------------------------------------------------------------------------------------------

enum class fill { normal, norm_weight };

struct tensor_spec {
    std::string            name;
    std::array<int64_t, 4> ne     = { 1, 1, 1, 1 };
    int                    n_dims = 1;
    ggml_type              type   = GGML_TYPE_F32;
    fill                   kind   = fill::normal;
    double                 stdev  = 0.0;
};

constexpr double k_bias_std = 0.02;
constexpr double k_norm_std = 0.1;
constexpr double k_embd_std = 0.2;

tensor_spec vec(const std::string & name, int64_t n, double stdev, fill kind = fill::normal) {
    tensor_spec t;
    t.name   = name;
    t.ne     = { n, 1, 1, 1 };
    t.n_dims = 1;
    t.kind   = kind;
    t.stdev  = stdev;
    return t;
}

// nn.Linear(n_in -> n_out): ggml ne {n_in, n_out}
tensor_spec linear_w(const std::string & name, int64_t n_in, int64_t n_out) {
    tensor_spec t;
    t.name   = name;
    t.ne     = { n_in, n_out, 1, 1 };
    t.n_dims = 2;
    t.stdev  = 1.0 / std::sqrt(double(n_in));
    return t;
}

tensor_spec patch_embd(const std::string & name, int64_t p, int64_t n_embd) {
    tensor_spec t;
    t.name   = name;
    t.ne     = { p, p, 3, n_embd };  // conv2d kernel {KW, KH, C_in, C_out}
    t.n_dims = 4;
    t.type   = GGML_TYPE_F16;       // as real converters; im2col runs in F16
    t.stdev  = 1.0 / std::sqrt(double(3 * p * p));
    return t;
}

void add_linear(std::vector<tensor_spec> & v, const std::string & base, int64_t n_in, int64_t n_out) {
    v.push_back(linear_w(base + ".weight", n_in, n_out));
    v.push_back(vec(base + ".bias", n_out, k_bias_std));
}

void add_norm(std::vector<tensor_spec> & v, const std::string & base, int64_t n) {
    v.push_back(vec(base + ".weight", n, k_norm_std, fill::norm_weight));
    v.push_back(vec(base + ".bias", n, k_bias_std));
}

int32_t vit_grid(const tiny_mmproj_config & c) {
    return c.image_size / c.patch_size;
}

bool dynamic_size(mmproj_type t) {  // Qwen2-VL's family: images keep their aspect, 2x2 patches merged
    return t == mmproj_type::qwen2vl_merger || t == mmproj_type::qwen25vl_merger || t == mmproj_type::qwen3vl_merger;
}

bool pixel_shuffle(mmproj_type t) {  // s x s neighbouring patches become one token of s^2 E values
    return t == mmproj_type::internvl || t == mmproj_type::idefics3;
}

void validate(const tiny_mmproj_config & c) {
    auto fail = [](const std::string & m) { throw std::invalid_argument("tiny_mmproj: " + m); };
    if (c.patch_size <= 0 || c.image_size < c.patch_size) {
        fail("need patch_size > 0 and image_size >= patch_size");
    }
    if (c.n_embd <= 0 || c.n_head <= 0 || c.n_embd % c.n_head != 0) {
        fail("n_embd must be a positive multiple of n_head");
    }
    if (dynamic_size(c.type) && (c.n_embd / c.n_head) % 4 != 0) {
        fail("qwen2vl_merger / qwen2.5vl_merger: head dim (n_embd / n_head) must be a multiple of 4 (vision M-RoPE "
             "sections d/4)");
    }
    if (c.n_ff <= 0 || c.n_ff == c.n_embd) {
        fail("n_ff must be > 0 and differ from n_embd (mtmd swaps ffn_up/ffn_down when ffn_down.ne[0] == n_embd)");
    }
    if (c.n_block < 1) {
        fail("n_block must be >= 1");
    }
    if (c.n_embd_text <= 0) {
        fail("n_embd_text must be > 0");
    }
    if ((pixel_shuffle(c.type) || c.type == mmproj_type::gemma3) &&
        (c.scale_factor < 2 || vit_grid(c) % c.scale_factor != 0)) {
        fail("internvl / idefics3 / gemma3: scale_factor must be >= 2 and divide image_size / patch_size");
    }
    for (int32_t b : c.type == mmproj_type::qwen3vl_merger ? c.deepstack_blocks : std::vector<int32_t>{}) {
        if (b < 0 || b >= c.n_block) {
            fail("qwen3vl_merger: deepstack blocks must be ViT blocks");
        }
    }
    if (c.type == mmproj_type::llava_next) {
        if (c.grid_pinpoints.empty() || c.grid_pinpoints.size() % 2 != 0) {
            fail("llava_next: grid_pinpoints must hold (width, height) pairs");
        }
        for (int32_t v : c.grid_pinpoints) {
            if (v <= 0 || v % c.image_size != 0) {  // a smaller edge tile is not square: the llava graph aborts
                fail("llava_next: every pinpoint must be a multiple of image_size");
            }
        }
    }
}

// The ViT's input: patch embeddings and, where the model has them, class token, learned positions and pre-norm.
void add_embeddings(std::vector<tensor_spec> & v, const tiny_mmproj_config & c) {
    const int64_t E = c.n_embd, p = c.patch_size, g = vit_grid(c);
    tensor_spec   pos = linear_w("v.position_embd.weight", E, g * g);
    pos.stdev         = k_embd_std;
    switch (c.type) {
        case mmproj_type::qwen2vl_merger:
        case mmproj_type::qwen25vl_merger:
            // Conv3d patch embedding split into two Conv2d kernels (temporal frames 0 and 1), no bias, no class or
            // position embeddings (2-D M-RoPE inside the ViT), no pre-norm.
            v.push_back(patch_embd("v.patch_embd.weight", p, E));
            v.push_back(patch_embd("v.patch_embd.weight.1", p, E));
            return;
        case mmproj_type::llava_mlp:
        case mmproj_type::llava_next:
            // CLIP ViT: class token, learned positions for grid^2 + 1 tokens, pre-layernorm.
            v.push_back(vec("v.class_embd", E, k_embd_std));
            v.push_back(patch_embd("v.patch_embd.weight", p, E));
            pos.ne[1] = g * g + 1;
            v.push_back(pos);
            add_norm(v, "v.pre_ln", E);
            return;
        case mmproj_type::internvl:
            // InternViT: patch bias, class token (appended after the patches by llama.cpp), positions for it too.
            v.push_back(vec("v.class_embd", E, k_embd_std));
            v.push_back(patch_embd("v.patch_embd.weight", p, E));
            v.push_back(vec("v.patch_embd.bias", E, k_bias_std));
            pos.ne[1] = g * g + 1;
            v.push_back(pos);
            return;
        case mmproj_type::idefics3:
        case mmproj_type::gemma3:
            // SigLIP: patch bias, positions, no class token (the converters store the embeddings in F32).
            v.push_back(patch_embd("v.patch_embd.weight", p, E));
            v.back().type = GGML_TYPE_F32;
            v.push_back(vec("v.patch_embd.bias", E, k_bias_std));
            v.push_back(pos);
            return;
        case mmproj_type::qwen3vl_merger:
            // Qwen2-VL's two patch kernels, with a bias, plus learned positions (interpolated to the image's grid)
            v.push_back(patch_embd("v.patch_embd.weight", p, E));
            v.push_back(patch_embd("v.patch_embd.weight.1", p, E));
            v.push_back(vec("v.patch_embd.bias", E, k_bias_std));
            v.push_back(pos);
            return;
    }
}

void add_block(std::vector<tensor_spec> & v, const tiny_mmproj_config & c, int32_t il) {
    const int64_t     E = c.n_embd, F = c.n_ff;
    const std::string b = "v.blk." + std::to_string(il) + ".";
    const bool        rms = c.type == mmproj_type::qwen25vl_merger;  // RMSNorm, weight only, and a gated FFN
    auto norm = [&](const std::string & name) {
        rms ? v.push_back(vec(name + ".weight", E, k_norm_std, fill::norm_weight)) : add_norm(v, name, E);
    };
    norm(b + "ln1");
    if (c.type == mmproj_type::qwen3vl_merger) {  // fused Q/K/V
        add_linear(v, b + "attn_qkv", E, 3 * E);
        add_linear(v, b + "attn_out", E, E);
    } else {
        for (const char * w : { "attn_q", "attn_k", "attn_v", "attn_out" }) {
            add_linear(v, b + w, E, E);
        }
    }
    norm(b + "ln2");
    if (rms) {
        add_linear(v, b + "ffn_gate", E, F);
    }
    add_linear(v, b + "ffn_up", E, F);
    add_linear(v, b + "ffn_down", F, E);
    if (c.type == mmproj_type::internvl) {  // layer scales
        v.push_back(vec(b + "ls1.weight", E, k_norm_std, fill::norm_weight));
        v.push_back(vec(b + "ls2.weight", E, k_norm_std, fill::norm_weight));
    }
}

// From the ViT's output to the text model's embedding width T.
void add_projector(std::vector<tensor_spec> & v, const tiny_mmproj_config & c) {
    const int64_t E = c.n_embd, T = c.n_embd_text, S = int64_t(c.scale_factor) * c.scale_factor;
    switch (c.type) {
        case mmproj_type::qwen2vl_merger:  // PatchMerger: ln_q (v.post_ln), then 2x2 patches: 4E -> 4E -> GELU -> T
            add_norm(v, "v.post_ln", E);
            add_linear(v, "mm.0", 4 * E, 4 * E);
            add_linear(v, "mm.2", 4 * E, T);
            return;
        case mmproj_type::qwen25vl_merger:  // the same with an RMSNorm ln_q
            v.push_back(vec("v.post_ln.weight", E, k_norm_std, fill::norm_weight));
            add_linear(v, "mm.0", 4 * E, 4 * E);
            add_linear(v, "mm.2", 4 * E, T);
            return;
        case mmproj_type::llava_mlp:  // mlp2x_gelu: E -> T -> GELU -> T (no post_ln: LLaVA reads the penultimate layer)
            add_linear(v, "mm.0", E, T);
            add_linear(v, "mm.2", T, T);
            return;
        case mmproj_type::llava_next:  // the same; the image newline as published files hold it (unused by mtmd)
            add_linear(v, "mm.0", E, T);
            add_linear(v, "mm.2", T, T);
            v.push_back(vec("model.image_newline", T, k_embd_std));
            return;
        case mmproj_type::internvl:  // pixel shuffle, LayerNorm, s^2 E -> T -> GELU -> T
            add_norm(v, "mm.model.mlp.0", S * E);
            add_linear(v, "mm.model.mlp.1", S * E, T);
            add_linear(v, "mm.model.mlp.3", T, T);
            return;
        case mmproj_type::idefics3:  // post-norm, pixel shuffle, one linear map without bias
            add_norm(v, "v.post_ln", E);
            v.push_back(linear_w("mm.model.fc.weight", S * E, T));
            return;
        case mmproj_type::gemma3: {  // post-norm, average pooling, RMSNorm, E -> T without bias, stored {T, E}
            add_norm(v, "v.post_ln", E);
            v.push_back(vec("mm.soft_emb_norm.weight", E, k_norm_std, fill::norm_weight));
            tensor_spec w = linear_w("mm.input_projection.weight", T, E);
            w.stdev       = 1.0 / std::sqrt(double(E));
            v.push_back(w);
            return;
        }
        case mmproj_type::qwen3vl_merger:  // the merger, then one per deepstack block (its features after it)
            add_norm(v, "v.post_ln", E);
            add_linear(v, "mm.0", 4 * E, 4 * E);
            add_linear(v, "mm.2", 4 * E, T);
            for (int32_t b : c.deepstack_blocks) {
                const std::string d = "v.deepstack." + std::to_string(b) + ".";
                add_norm(v, d + "norm", 4 * E);
                add_linear(v, d + "fc1", 4 * E, 4 * E);
                add_linear(v, d + "fc2", 4 * E, T);
            }
            return;
    }
}

std::vector<tensor_spec> plan(const tiny_mmproj_config & c) {
    validate(c);
    std::vector<tensor_spec> v;
    add_embeddings(v, c);
    for (int32_t il = 0; il < c.n_block; ++il) {
        add_block(v, c, il);
    }
    add_projector(v, c);
    return v;
}

bool omitted(const tiny_mmproj_config & c, const std::string & name) {
    return std::find(c.omit.begin(), c.omit.end(), name) != c.omit.end();
}

void fill_tensor(ggml_tensor * t, const tensor_spec & s, uint64_t seed) {
    const int64_t n = ggml_nelements(t);
    splitmix64         rng{ seed ^ fnv1a(s.name) };
    for (int64_t i = 0; i < n; ++i) {
        const double z = rng.normal();
        const float  x = float(s.kind == fill::norm_weight ? 1.0 + s.stdev * z : s.stdev * z);
        if (t->type == GGML_TYPE_F16) {
            static_cast<ggml_fp16_t *>(t->data)[i] = ggml_fp32_to_fp16(x);
        } else {
            static_cast<float *>(t->data)[i] = x;
        }
    }
}

struct gguf_free_deleter {
    void operator()(gguf_context * g) const { gguf_free(g); }
};

struct ggml_free_deleter {
    void operator()(ggml_context * g) const { ggml_free(g); }
};

}  // namespace

const char * mmproj_type_name(mmproj_type t) {
    switch (t) {
        case mmproj_type::qwen2vl_merger:
            return "qwen2vl_merger";
        case mmproj_type::llava_mlp:
        case mmproj_type::llava_next:
            return "mlp";
        case mmproj_type::qwen25vl_merger:
            return "qwen2.5vl_merger";
        case mmproj_type::qwen3vl_merger:
            return "qwen3vl_merger";
        case mmproj_type::gemma3:
            return "gemma3";
        case mmproj_type::internvl:
            return "internvl";
        case mmproj_type::idefics3:
            return "idefics3";
    }
    return "?";
}

std::vector<std::string> tiny_mmproj_tensor_names(const tiny_mmproj_config & c) {
    std::vector<std::string> names;
    for (const auto & s : plan(c)) {
        names.push_back(s.name);
    }
    return names;
}

void write_tiny_mmproj(const std::string & path, const tiny_mmproj_config & c) {
    const std::vector<tensor_spec> specs = plan(c);

    std::unique_ptr<gguf_context, gguf_free_deleter> g(gguf_init_empty());
    if (!g) {
        throw std::runtime_error("tiny_mmproj: gguf_init_empty failed");
    }
    gguf_context * gc = g.get();
    auto set_u32 = [&](const char * k, int32_t v) {
        if (!omitted(c, k)) {
            gguf_set_val_u32(gc, k, uint32_t(v));
        }
    };
    auto set_f32 = [&](const char * k, float v) {
        if (!omitted(c, k)) {
            gguf_set_val_f32(gc, k, v);
        }
    };
    auto set_bool = [&](const char * k, bool v) {
        if (!omitted(c, k)) {
            gguf_set_val_bool(gc, k, v);
        }
    };
    auto set_str = [&](const char * k, const std::string & v) {
        if (!omitted(c, k)) {
            gguf_set_val_str(gc, k, v.c_str());
        }
    };
    auto set_f32_arr = [&](const char * k, const std::array<float, 3> & v) {
        if (!omitted(c, k)) {
            gguf_set_arr_data(gc, k, GGUF_TYPE_FLOAT32, v.data(), v.size());
        }
    };

    // metadata as the upstream converters write it; the loader requires has_vision_encoder, projector_type,
    // the vision embedding_length / head_count / feed_forward_length / block_count / projection_dim /
    // attention.layer_norm_epsilon, image_size, patch_size and (>= 3 element) image_mean / image_std.
    set_str("general.architecture", "clip");
    set_str("general.name", std::string("ecokv-tiny-mmproj-") + mmproj_type_name(c.type));
    set_str("general.description", "random-weight test projector (tests/llama/tiny-mmproj.cpp)");
    set_bool("clip.has_vision_encoder", true);
    set_bool("clip.has_audio_encoder", false);
    set_str("clip.projector_type", mmproj_type_name(c.type));
    // ViT FFN activation: quick GELU (CLIP, Qwen2-VL), gated SiLU (Qwen2.5-VL), tanh GELU (InternViT, SigLIP)
    if (c.type == mmproj_type::qwen25vl_merger) {
        set_bool("clip.use_silu", true);
    } else {
        set_bool("clip.use_gelu", pixel_shuffle(c.type) || c.type == mmproj_type::gemma3 ||
                                      c.type == mmproj_type::qwen3vl_merger);
    }
    set_u32("clip.vision.image_size", c.image_size);
    set_u32("clip.vision.patch_size", c.patch_size);
    set_u32("clip.vision.embedding_length", c.n_embd);
    set_u32("clip.vision.feed_forward_length", c.n_ff);
    set_u32("clip.vision.block_count", c.n_block);
    set_u32("clip.vision.projection_dim", c.n_embd_text);
    set_u32("clip.vision.attention.head_count", c.n_head);
    set_f32("clip.vision.attention.layer_norm_epsilon", c.type == mmproj_type::qwen2vl_merger ? 1e-6f : 1e-5f);
    switch (c.type) {
        case mmproj_type::llava_next:
            if (!omitted(c, "clip.vision.image_grid_pinpoints")) {  // (width, height) pairs, INT32 as mtmd reads them
                gguf_set_arr_data(gc, "clip.vision.image_grid_pinpoints", GGUF_TYPE_INT32, c.grid_pinpoints.data(),
                                  c.grid_pinpoints.size());
            }
            set_str("clip.vision.mm_patch_merge_type", "spatial_unpad");  // as published; mtmd 0.5.0 ignores it
            break;
        case mmproj_type::qwen25vl_merger:
            set_u32("clip.vision.n_wa_pattern", c.n_wa_pattern);
            break;
        case mmproj_type::idefics3:
            set_u32("clip.vision.preproc_image_size", c.preproc_image_size);
            [[fallthrough]];
        case mmproj_type::internvl:
        case mmproj_type::gemma3:
            set_u32("clip.vision.projector.scale_factor", c.scale_factor);
            break;
        case mmproj_type::qwen3vl_merger: {
            set_u32("clip.vision.spatial_merge_size", 2);
            std::vector<int8_t> deepstack(size_t(c.n_block), 0);  // as published; mtmd counts the tensors instead
            for (int32_t b : c.deepstack_blocks) {
                deepstack[size_t(b)] = 1;
            }
            if (!omitted(c, "clip.vision.is_deepstack_layers")) {
                gguf_set_arr_data(gc, "clip.vision.is_deepstack_layers", GGUF_TYPE_BOOL, deepstack.data(), deepstack.size());
            }
            break;
        }
        default:
            break;
    }
    set_f32_arr("clip.vision.image_mean", { 0.48145466f, 0.4578275f, 0.40821073f });
    set_f32_arr("clip.vision.image_std", { 0.26862954f, 0.26130258f, 0.27577711f });

    size_t n_bytes = 0, n_tensors = 0;
    for (const auto & s : specs) {
        const size_t n = size_t(s.ne[0] * s.ne[1] * s.ne[2] * s.ne[3]);
        n_bytes += n * ggml_type_size(s.type) + GGML_MEM_ALIGN;
        ++n_tensors;
    }
    ggml_init_params ip{};
    ip.mem_size   = n_bytes + (n_tensors + 1) * ggml_tensor_overhead();
    ip.mem_buffer = nullptr;
    ip.no_alloc   = false;
    std::unique_ptr<ggml_context, ggml_free_deleter> ctx(ggml_init(ip));
    if (!ctx) {
        throw std::runtime_error("tiny_mmproj: ggml_init failed");
    }

    for (const auto & s : specs) {
        if (omitted(c, s.name)) {
            continue;
        }
        ggml_tensor * t = ggml_new_tensor(ctx.get(), s.type, s.n_dims, s.ne.data());
        ggml_set_name(t, s.name.c_str());
        fill_tensor(t, s, c.seed);
        gguf_add_tensor(gc, t);  // copies the data pointer; the data must stay alive until the write
    }

    if (!gguf_write_to_file(gc, path.c_str(), /*only_meta =*/false)) {
        throw std::runtime_error("tiny_mmproj: cannot write " + path);
    }
}

std::string temp_gguf_path(const std::string & prefix) {
    static std::atomic<uint64_t> counter{ 0 };
    const auto dir = std::filesystem::temp_directory_path();
    return (dir / (prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".gguf")).string();
}

temp_file::~temp_file() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
}

std::unique_ptr<temp_file> write_tiny_mmproj_temp(const tiny_mmproj_config & c) {
    auto f = std::make_unique<temp_file>(temp_gguf_path());
    write_tiny_mmproj(f->path(), c);
    return f;
}

namespace {

// One chunk of `n_tokens` image embeddings in a row with 1-D positions (every projector but Qwen2-VL's family).
image_geometry one_row(int32_t width, int32_t height, int32_t n_tokens) {
    return { width, height, n_tokens, 1, n_tokens, n_tokens };
}

image_geometry dynamic_geometry(const tiny_mmproj_config & c, int32_t nx, int32_t ny, int32_t image_min_tokens,
                                int32_t image_max_tokens) {
    image_geometry g;
    // mtmd_image_preprocessor_dyn_size with img_tool::calc_size_preserved_ratio (float arithmetic as there):
    // align a = patch_size * n_merge (n_merge = 2), min/max pixels = {8, 4096} merged tokens * a^2
    // (clip_model_loader::load_hparams, set_limit_image_tokens(8, 4096); custom_image_{min,max}_tokens win).
    const int   a          = c.patch_size * 2;
    const int   min_pixels = (image_min_tokens > 0 ? image_min_tokens : 8) * a * a;
    const int   max_pixels = (image_max_tokens > 0 ? image_max_tokens : 4096) * a * a;
    const float f          = float(a);
    auto round_f = [&](float x) { return int(std::round(x / f)) * a; };
    auto ceil_f  = [&](float x) { return int(std::ceil(x / f)) * a; };
    auto floor_f = [&](float x) { return int(std::floor(x / f)) * a; };
    int w = std::max(a, round_f(float(nx)));
    int h = std::max(a, round_f(float(ny)));
    if (h * w > max_pixels) {
        const float beta = std::sqrt(float(ny) * float(nx) / float(max_pixels));
        h                = std::max(a, floor_f(float(ny) / beta));
        w                = std::max(a, floor_f(float(nx) / beta));
    } else if (h * w < min_pixels) {
        const float beta = std::sqrt(float(min_pixels) / (float(ny) * float(nx)));
        h                = ceil_f(float(ny) * beta);
        w                = ceil_f(float(nx) * beta);
    }
    g.width    = w;
    g.height   = h;
    g.tokens_x = w / a;
    g.tokens_y = h / a;
    g.n_tokens = g.tokens_x * g.tokens_y;
    g.n_pos    = std::max(g.tokens_x, g.tokens_y);
    return g;
}


// LLaVA-NeXT's best resolution (mtmd_image_preprocessor_llava_uhd::select_best_resolution, float arithmetic as there):
// the candidate showing most of the image once resized into it with its aspect kept, then the least padding.
std::pair<int32_t, int32_t> best_resolution(const std::vector<std::pair<int32_t, int32_t>> & candidates, int32_t nx,
                                            int32_t ny) {
    std::pair<int32_t, int32_t> best;
    int32_t                     best_effective = 0, least_waste = std::numeric_limits<int32_t>::max();
    for (const auto & [w, h] : candidates) {
        const float   scale     = std::min(float(w) / float(nx), float(h) / float(ny));
        const int32_t effective = std::min(int32_t(float(nx) * scale) * int32_t(float(ny) * scale), nx * ny);
        const int32_t waste     = w * h - effective;
        if (effective > best_effective || (effective == best_effective && waste < least_waste)) {
            best_effective = effective;
            least_waste    = waste;
            best           = { w, h };
        }
    }
    return best;
}

// The tile candidates of a llava-uhd preprocessor: LLaVA-NeXT's pinpoints, or InternVL's a x b tiles with
// 1 <= a * b <= 12 (clip.cpp set_internvl_dhr_res_candidates, default preproc_min/max_tiles).
std::vector<std::pair<int32_t, int32_t>> tile_candidates(const tiny_mmproj_config & c) {
    std::vector<std::pair<int32_t, int32_t>> out;
    if (c.type == mmproj_type::llava_next) {
        for (size_t i = 0; i + 1 < c.grid_pinpoints.size(); i += 2) {
            out.emplace_back(c.grid_pinpoints[i], c.grid_pinpoints[i + 1]);
        }
        return out;
    }
    for (int32_t a = 1; a <= 12; ++a) {
        for (int32_t b = 1; b <= 12 / a; ++b) {
            out.emplace_back(a * c.image_size, b * c.image_size);
        }
    }
    return out;
}

}  // namespace

image_layout expected_image_layout(const tiny_mmproj_config & c, int32_t nx, int32_t ny, int32_t image_min_tokens,
                                   int32_t image_max_tokens) {
    image_layout l;
    if (nx <= 0 || ny <= 0) {
        return l;
    }
    const int32_t S = c.image_size, g = vit_grid(c);
    const int32_t per_tile = pixel_shuffle(c.type) ? (g / c.scale_factor) * (g / c.scale_factor) : g * g;
    switch (c.type) {
        case mmproj_type::qwen2vl_merger:
        case mmproj_type::qwen25vl_merger:
        case mmproj_type::qwen3vl_merger:
            l.chunks.push_back(dynamic_geometry(c, nx, ny, image_min_tokens, image_max_tokens));
            return l;
        case mmproj_type::gemma3: {  // fixed size, then s x s average pooling
            const int32_t side = g / c.scale_factor;
            l.chunks.push_back(one_row(S, S, side * side));
            return l;
        }
        case mmproj_type::llava_mlp:
            // mtmd_image_preprocessor_fixed_size: resize to image_size^2; every patch is a token (the class token is
            // dropped by the "patches" get_rows); clip_n_output_tokens_x = n_tokens, _y = 1.
            l.chunks.push_back(one_row(S, S, per_tile));
            return l;
        case mmproj_type::llava_next:
        case mmproj_type::internvl:
            // llava-uhd slicing: an image within one tile is the overview alone; a larger one is resized into the
            // best candidate (aspect kept, padded) and cut into image_size tiles, row-major, the overview last.
            if (nx > S || ny > S) {
                const auto [w, h] = best_resolution(tile_candidates(c), nx, ny);
                l.tiles_x = w / S;
                l.tiles_y = h / S;
            }
            break;
        case mmproj_type::idefics3: {
            // Idefics3: the longest side resized to preproc_image_size (small images too), the other side kept in
            // proportion (made even), then stretched to whole tiles; always a grid, the overview last.
            const double aspect = double(nx) / double(ny);
            int32_t      w = c.preproc_image_size, h = c.preproc_image_size;
            if (nx >= ny) {
                h = int32_t(c.preproc_image_size / aspect);
                h += h % 2;
            } else {
                w = int32_t(c.preproc_image_size * aspect);
                w += w % 2;
            }
            l.tiles_x = (w + S - 1) / S;
            l.tiles_y = (h + S - 1) / S;
            break;
        }
    }
    for (int32_t i = 0; i < l.tiles_x * l.tiles_y; ++i) {
        l.chunks.push_back(one_row(S, S, per_tile));
    }
    l.chunks.push_back(one_row(S, S, per_tile));  // the overview
    return l;
}

int32_t image_layout::n_tokens() const {
    int32_t n = 0;
    for (const image_geometry & g : chunks) {
        n += g.n_tokens;
    }
    return n;
}

image_geometry expected_image_geometry(const tiny_mmproj_config & c, int32_t nx, int32_t ny, int32_t image_min_tokens,
                                       int32_t image_max_tokens) {
    const image_layout l = expected_image_layout(c, nx, ny, image_min_tokens, image_max_tokens);
    if (l.chunks.size() > 1) {
        throw std::invalid_argument("expected_image_geometry: the image is " + std::to_string(l.chunks.size()) +
                                    " chunks (expected_image_layout)");
    }
    return l.chunks.empty() ? image_geometry{} : l.chunks[0];
}

std::vector<uint8_t> make_test_image_rgb(int32_t nx, int32_t ny, uint64_t seed) {
    if (nx <= 0 || ny <= 0) {
        throw std::invalid_argument("make_test_image_rgb: nx and ny must be positive");
    }
    std::vector<uint8_t> px(size_t(nx) * size_t(ny) * 3);
    splitmix64                rng{ seed ^ 0x696d616765ull };  // "image"
    // per-seed gradient directions, so different seeds give visibly different images
    const double a0 = rng.uniform() * 6.283185307179586, a1 = rng.uniform() * 6.283185307179586;
    for (int32_t y = 0; y < ny; ++y) {
        for (int32_t x = 0; x < nx; ++x) {
            const double u = double(x) / std::max(1, nx - 1), v = double(y) / std::max(1, ny - 1);
            const double base[3] = {
                127.5 + 110.0 * std::cos(a0) * (2 * u - 1) + 110.0 * std::sin(a0) * (2 * v - 1),
                127.5 + 110.0 * std::cos(a1) * (2 * v - 1) - 110.0 * std::sin(a1) * (2 * u - 1),
                127.5 + 100.0 * std::sin(6.283185307179586 * (u + v)),
            };
            for (int ch = 0; ch < 3; ++ch) {
                const double val = base[ch] + 24.0 * (rng.uniform() - 0.5);
                px[(size_t(y) * size_t(nx) + size_t(x)) * 3 + size_t(ch)] =
                    uint8_t(std::clamp(std::lround(val), 0L, 255L));
            }
        }
    }
    return px;
}

void mtmd_bitmap_deleter::operator()(mtmd_bitmap * b) const {
    mtmd_bitmap_free(b);
}

bitmap_ptr make_test_bitmap(int32_t nx, int32_t ny, uint64_t seed) {
    const std::vector<uint8_t> px = make_test_image_rgb(nx, ny, seed);
    bitmap_ptr                 b(mtmd_bitmap_init(uint32_t(nx), uint32_t(ny), px.data()));
    if (!b) {
        throw std::runtime_error("make_test_bitmap: mtmd_bitmap_init failed");
    }
    return b;
}

void write_test_ppm(const std::string & path, int32_t nx, int32_t ny, uint64_t seed) {
    const std::vector<uint8_t> px = make_test_image_rgb(nx, ny, seed);
    std::ofstream out(path, std::ios::binary);
    out << "P6\n" << nx << " " << ny << "\n255\n";
    out.write(reinterpret_cast<const char *>(px.data()), std::streamsize(px.size()));
}

tiny_vlm_files write_tiny_vlm(const std::string & dir, const std::string & arch, mmproj_type type) {
    tiny_config c;
    c.arch = arch;
    const tiny_model m = make_tiny_model(c);
    tiny_vlm_files   f{ dir + "/model.gguf", dir + "/mmproj.gguf" };
    llama_model_save_to_file(m.get(), f.model.c_str());
    tiny_mmproj_config p;
    p.type        = type;
    p.n_embd_text = c.n_embd;
    write_tiny_mmproj(f.mmproj, p);
    return f;
}

const std::vector<vlm_family> & vlm_families() {
    static const std::vector<vlm_family> families = {
        { "llava-1.5", "llama", mmproj_type::llava_mlp },        { "qwen2-vl", "qwen2vl", mmproj_type::qwen2vl_merger },
        { "llava-next", "llama", mmproj_type::llava_next },      { "qwen2.5-vl", "qwen2vl", mmproj_type::qwen25vl_merger },
        { "internvl3", "qwen2", mmproj_type::internvl },         { "smolvlm", "llama", mmproj_type::idefics3 },
        { "gemma-3", "gemma3", mmproj_type::gemma3 },            { "qwen3-vl", "qwen3vl", mmproj_type::qwen3vl_merger },
    };
    return families;
}

namespace {

// llama_model_save_to_file writes no chat template: the key is added to the saved file (rewritten in place).
void set_chat_template(const std::string & path, const std::string & tmpl) {
    if (!tmpl.empty()) {
        rewrite_gguf(path, path, [&](gguf_context * g) { gguf_set_val_str(g, "tokenizer.chat_template", tmpl.c_str()); });
    }
}

}  // namespace

void rewrite_gguf(const std::string & src, const std::string & dst, const std::function<void(gguf_context *)> & edit,
                  const std::map<std::string, std::vector<int64_t>> & reshape) {
    ggml_context *                                   data = nullptr;
    std::unique_ptr<gguf_context, gguf_free_deleter> in(gguf_init_from_file(src.c_str(), { false, &data }));
    std::unique_ptr<ggml_context, ggml_free_deleter> hold(data);
    if (!in) {
        throw std::runtime_error("rewrite_gguf: cannot read " + src);
    }
    size_t reshaped_bytes = ggml_tensor_overhead() * (reshape.size() + 1);
    for (const auto & [name, shape] : reshape) {
        const ggml_tensor * t = ggml_get_tensor(data, name.c_str());
        if (t == nullptr) {
            throw std::runtime_error("rewrite_gguf: " + src + " has no tensor '" + name + "' to reshape");
        }
        size_t n = ggml_type_size(t->type);
        for (const int64_t d : shape) {
            n *= size_t(d);
        }
        reshaped_bytes += n + 64;
    }
    std::unique_ptr<ggml_context, ggml_free_deleter> extra(ggml_init({ reshaped_bytes, nullptr, false }));
    std::unique_ptr<gguf_context, gguf_free_deleter> out(gguf_init_empty());
    gguf_set_kv(out.get(), in.get());
    edit(out.get());
    for (int64_t i = 0; i < gguf_get_n_tensors(in.get()); ++i) {
        ggml_tensor * t  = ggml_get_tensor(data, gguf_get_tensor_name(in.get(), i));
        const auto    it = reshape.find(t->name);
        if (it != reshape.end()) {
            ggml_tensor * r = ggml_new_tensor(extra.get(), t->type, int(it->second.size()), it->second.data());
            ggml_set_name(r, t->name);
            std::memset(r->data, 0, ggml_nbytes(r));
            t = r;
        }
        gguf_add_tensor(out.get(), t);
    }
    const std::string part = dst + ".part";
    if (!gguf_write_to_file(out.get(), part.c_str(), false)) {
        std::filesystem::remove(part);
        throw std::runtime_error("rewrite_gguf: cannot write " + part);
    }
    std::filesystem::rename(part, dst);
}

tiny_config vlm_text_config(const vlm_family & family) {
    tiny_config c;
    c.arch      = family.arch;
    c.tokenizer = "bpe";
    c.n_vocab   = 300;
    if (family.projector == mmproj_type::qwen3vl_merger) {
        c.n_deepstack_layers = 1;  // tiny_mmproj_config's one deepstack block
    }
    // The family's chat template, shortened to what llama.cpp recognises it by (llm_chat_detect_template)
    const std::string name = family.name;
    if (name.rfind("llava", 0) == 0) {  // LLaVA's Vicuna conversation
        c.chat_template = "{% for m in messages %}USER: {{ m['content'] }}\nASSISTANT: {% endfor %}";
    } else if (name == "gemma-3") {
        c.chat_template = "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
                          "<end_of_turn>\n{% endfor %}";
    } else if (name == "smolvlm") {
        c.chat_template = "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}"
                          "<end_of_utterance>\n{% endfor %}";
    } else {  // Qwen2-VL, Qwen2.5-VL, Qwen3-VL, InternVL3: ChatML
        c.chat_template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}";
    }
    return c;
}

tiny_mmproj_config vlm_mmproj_config(const vlm_family & family, int32_t n_embd_text) {
    tiny_mmproj_config p;
    p.type        = family.projector;
    p.n_block     = 2;
    p.n_embd_text = n_embd_text;
    return p;
}

tiny_vlm_files write_tiny_vlm(const std::string & dir, const vlm_family & family) {
    const tiny_config c = vlm_text_config(family);
    const tiny_model  m = make_tiny_model(c);
    tiny_vlm_files    f{ dir + "/model.gguf", dir + "/mmproj.gguf" };
    llama_model_save_to_file(m.get(), f.model.c_str());
    set_chat_template(f.model, c.chat_template);
    write_tiny_mmproj(f.mmproj, vlm_mmproj_config(family, c.n_embd));
    return f;
}

}  // namespace ecokv::test
