// Pre-flight check of GGUF model and projector files (gguf-check.h). The header is read by ggml's own GGUF reader
// (bounded by the file's size); what is checked here is what llama.cpp 0.5.0's loaders then take on trust:
//   - gguf.cpp: gguf_get_val_<T> asserts the key's type (clip_model_loader's get_u32/get_bool/get_f32/get_string);
//   - llama-vocab.cpp:2539 asserts that no two vocabulary entries are equal;
//   - clip.cpp load_tensors checks names, not shapes: a wrong shape fails an assert while the warm-up graph is built;
//   - tensor data past the end of the file.
#include "gguf-check.h"

#include "ecokv/error.h"

#include <ggml.h>
#include <gguf.h>

#include <optional>
#include <filesystem>
#include <set>
#include <sstream>
#include <unordered_set>
#include <vector>

namespace ecokv::llama {

namespace {

using shape = std::vector<int64_t>;

std::string to_string(const shape & s) {
    std::ostringstream o;
    o << '[';
    for (size_t i = 0; i < s.size(); ++i) {
        o << (i ? ", " : "") << s[i];
    }
    return o.str() + ']';
}

// One GGUF file's header and tensor table (no tensor data is read).
class gguf_file {
  public:
    explicit gguf_file(const std::string & path) : path_(path) {
        std::error_code ec;
        file_size_ = std::filesystem::file_size(path, ec);
        if (ec) {
            fail("cannot read the file (" + ec.message() + ")");
        }
        gguf_init_params params = { /*no_alloc=*/true, /*ctx=*/&meta_ };
        gguf_ = gguf_init_from_file(path.c_str(), params);
        if (gguf_ == nullptr) {
            fail("not a readable GGUF file (its header, key/values or tensor table are malformed or truncated)");
        }
    }
    ~gguf_file() {
        gguf_free(gguf_);
        ggml_free(meta_);
    }
    gguf_file(const gguf_file &)             = delete;
    gguf_file & operator=(const gguf_file &) = delete;

    [[noreturn]] void fail(const std::string & problem) const { throw error(path_ + ": " + problem); }

    // Every tensor's data inside the file, and no tensor with an empty dimension.
    void check_tensor_table() const {
        const uint64_t data = gguf_get_data_offset(gguf_);
        for (int64_t i = 0; i < gguf_get_n_tensors(gguf_); ++i) {
            const char *   name = gguf_get_tensor_name(gguf_, i);
            const uint64_t end  = data + gguf_get_tensor_offset(gguf_, i) + gguf_get_tensor_size(gguf_, i);
            if (end > file_size_) {
                fail("tensor '" + std::string(name) + "' ends at byte " + std::to_string(end) + ", past the end of the " +
                     std::to_string(file_size_) + "-byte file (truncated?)");
            }
            if (ggml_nelements(tensor(name)) == 0) {
                fail("tensor '" + std::string(name) + "' has an empty dimension");
            }
        }
    }

    int64_t key(const std::string & k) const { return gguf_find_key(gguf_, k.c_str()); }

    // A key present with another type than `type` (arrays: of `elem`) is an error.
    void expect_type(int64_t id, gguf_type type, gguf_type elem = GGUF_TYPE_COUNT) const {
        const gguf_type t = gguf_get_kv_type(gguf_, id);
        if (t != type || (type == GGUF_TYPE_ARRAY && elem != GGUF_TYPE_COUNT && gguf_get_arr_type(gguf_, id) != elem)) {
            fail("key '" + std::string(gguf_get_key(gguf_, id)) + "' is a " + type_name(id) + ", expected a " +
                 (type == GGUF_TYPE_ARRAY && elem != GGUF_TYPE_COUNT ? std::string("array of ") + gguf_type_name(elem)
                                                                       : gguf_type_name(type)));
        }
    }

    // An unsigned key in [lo, hi]; `fallback` when absent (or an error when required).
    int64_t u32(const std::string & k, int64_t lo, int64_t hi, std::optional<int64_t> fallback = std::nullopt) const {
        const int64_t id = key(k);
        if (id < 0) {
            if (!fallback) {
                fail("key '" + k + "' is missing");
            }
            return *fallback;
        }
        expect_type(id, GGUF_TYPE_UINT32);
        const int64_t v = gguf_get_val_u32(gguf_, id);
        if (v < lo || v > hi) {
            fail("key '" + k + "' is " + std::to_string(v) + ", outside [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "]");
        }
        return v;
    }

    std::string str(const std::string & k) const {
        const int64_t id = key(k);
        if (id < 0) {
            return "";
        }
        expect_type(id, GGUF_TYPE_STRING);
        return gguf_get_val_str(gguf_, id);
    }

    const ggml_tensor * tensor(const std::string & name) const { return ggml_get_tensor(meta_, name.c_str()); }

    // The tensor `name` with shape `s` (trailing 1s ignored); absent is an error when `required`.
    void expect(const std::string & name, const shape & s, bool required = true) const {
        const ggml_tensor * t = tensor(name);
        if (t == nullptr) {
            if (required) {
                fail("tensor '" + name + "' is missing");
            }
            return;
        }
        for (int d = 0; d < GGML_MAX_DIMS; ++d) {
            if (t->ne[d] != (d < int(s.size()) ? s[d] : 1)) {
                fail("tensor '" + name + "' has shape " + to_string(shape(t->ne, t->ne + GGML_MAX_DIMS)) +
                     ", expected " + to_string(s) + " from the hyperparameters");
            }
        }
    }

    const gguf_context * ctx() const { return gguf_; }

  private:
    std::string type_name(int64_t id) const {
        const gguf_type t = gguf_get_kv_type(gguf_, id);
        return t == GGUF_TYPE_ARRAY ? std::string("array of ") + gguf_type_name(gguf_get_arr_type(gguf_, id))
                                    : gguf_type_name(t);
    }

    std::string    path_;
    uint64_t       file_size_ = 0;
    gguf_context * gguf_      = nullptr;
    ggml_context * meta_      = nullptr;
};

// The vocabulary as llama-vocab.cpp reads it: strings, one score and one type per token, no entry twice.
void check_vocab(const gguf_file & f) {
    const int64_t tokens = f.key("tokenizer.ggml.tokens");
    if (tokens < 0) {
        return;  // llama.cpp refuses a model without one with its own message
    }
    f.expect_type(tokens, GGUF_TYPE_ARRAY, GGUF_TYPE_STRING);
    const size_t n = gguf_get_arr_n(f.ctx(), tokens);
    if (n == 0 || n > (1u << 24)) {
        f.fail("the vocabulary has " + std::to_string(n) + " tokens");
    }
    for (const auto & [k, type] : { std::pair{ "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32 },
                                     std::pair{ "tokenizer.ggml.token_type", GGUF_TYPE_INT32 } }) {
        if (const int64_t id = f.key(k); id >= 0) {
            f.expect_type(id, GGUF_TYPE_ARRAY, type);
            if (gguf_get_arr_n(f.ctx(), id) != n) {
                f.fail("key '" + std::string(k) + "' has " + std::to_string(gguf_get_arr_n(f.ctx(), id)) +
                       " entries for " + std::to_string(n) + " tokens");
            }
        }
    }
    std::unordered_set<std::string_view> seen;
    for (size_t i = 0; i < n; ++i) {
        if (!seen.insert(gguf_get_arr_str(f.ctx(), tokens, i)).second) {
            f.fail("vocabulary token " + std::to_string(i) + " ('" + gguf_get_arr_str(f.ctx(), tokens, i) +
                   "') appears twice");
        }
    }
}

// The tensors of the decoder-only architectures ecokv is tested on, with the shapes their hyperparameters give.
void check_decoder(const gguf_file & f, const std::string & arch, int64_t n_vocab) {
    const std::string a       = arch + ".";
    const int64_t     n_embd  = f.u32(a + "embedding_length", 1, 1 << 16);
    const int64_t     n_layer = f.u32(a + "block_count", 1, 1024);
    const int64_t     n_head  = f.u32(a + "attention.head_count", 1, 1024);
    const int64_t     n_kv    = f.u32(a + "attention.head_count_kv", 1, n_head, n_head);
    const int64_t     n_ff    = f.u32(a + "feed_forward_length", 1, 1 << 20);
    f.u32(a + "context_length", 1, 1 << 24);
    if (n_head % n_kv != 0) {
        f.fail(std::to_string(n_head) + " attention heads cannot be grouped over " + std::to_string(n_kv) + " KV heads");
    }
    if (f.key(a + "attention.key_length") < 0 && n_embd % n_head != 0) {
        f.fail("the embedding width " + std::to_string(n_embd) + " is not a multiple of " + std::to_string(n_head) +
               " heads");
    }
    const int64_t head_dim = f.u32(a + "attention.key_length", 1, 1 << 14, n_embd / n_head);
    f.u32(a + "attention.value_length", head_dim, head_dim, head_dim);
    f.u32(a + "rope.dimension_count", 0, head_dim, head_dim);
    const int64_t q = n_head * head_dim, kv = n_kv * head_dim;
    const bool    qkv_bias = arch == "qwen2" || arch == "qwen2vl";
    const bool    qk_norm  = arch == "qwen3vl" || arch == "gemma3";  // RMSNorm of each head's Q and K
    f.expect("token_embd.weight", { n_embd, n_vocab });
    f.expect("output_norm.weight", { n_embd });
    f.expect("output.weight", { n_embd, n_vocab }, false);
    for (int64_t il = 0; il < n_layer; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        f.expect(b + "attn_norm.weight", { n_embd });
        f.expect(b + "attn_q.weight", { n_embd, q });
        f.expect(b + "attn_k.weight", { n_embd, kv });
        f.expect(b + "attn_v.weight", { n_embd, kv });
        f.expect(b + "attn_output.weight", { q, n_embd });
        f.expect(b + "attn_q.bias", { q }, qkv_bias);
        f.expect(b + "attn_k.bias", { kv }, qkv_bias);
        f.expect(b + "attn_v.bias", { kv }, qkv_bias);
        f.expect(b + "attn_q_norm.weight", { head_dim }, qk_norm);
        f.expect(b + "attn_k_norm.weight", { head_dim }, qk_norm);
        f.expect(b + "post_attention_norm.weight", { n_embd }, arch == "gemma3");
        f.expect(b + "post_ffw_norm.weight", { n_embd }, arch == "gemma3");
        f.expect(b + "ffn_norm.weight", { n_embd });
        if (f.tensor(b + "ffn_gate_inp.weight")) {
            continue;  // a mixture of experts: its expert tensors are llama.cpp's to check
        }
        f.expect(b + "ffn_gate.weight", { n_embd, n_ff });
        f.expect(b + "ffn_up.weight", { n_embd, n_ff });
        f.expect(b + "ffn_down.weight", { n_ff, n_embd });
    }
}

// The type clip_model_loader asserts for a key it reads (GGUF_TYPE_COUNT: one it does not read, or reads with a
// check of its own).
gguf_type clip_key_type(const std::string & k) {
    static const std::set<std::string> strings = { "general.name", "general.description", "clip.projector_type",
                                                   "clip.vision.projector_type", "clip.audio.projector_type",
                                                   "clip.gen.audio.projector_type", "clip.vision.mm_patch_merge_type",
                                                   "clip.gen.audio.model_variant" };
    static const std::set<std::string> bools = { "clip.has_vision_encoder", "clip.has_audio_encoder",
                                                 "clip.has_gen_audio_encoder", "clip.use_gelu", "clip.use_silu" };
    // clip.cpp's get_u32 keys; "clip.%s." ones for both modalities
    static const std::set<std::string> u32 = [] {
        std::set<std::string> s = {
            "clip.vision.window_size", "clip.audio.subsampling_factor", "clip.audio.window_size",
            "clip.audio.chunk_size", "clip.audio.conv_kernel_size", "clip.audio.local_block_count",
            "clip.audio.local_group_size", "clip.audio.max_pos_emb", "clip.audio.num_mel_bins",
            "clip.audio.projector.downsample_rate", "clip.audio.projector.head_count",
            "clip.audio.projector.stack_factor", "clip.audio.projector.window_size", "clip.audio.rvq.num_quantizers",
            "clip.vision.image_max_pixels", "clip.vision.image_min_pixels", "clip.vision.image_size",
            "clip.minicpmv_query_num", "clip.vision.patch_size", "clip.vision.preproc_image_size",
            "clip.vision.preproc_max_tiles", "clip.vision.preproc_min_tiles", "clip.vision.projector.query_side",
            "clip.vision.projector.window_side", "clip.vision.projector.scale_factor", "clip.vision.sam.block_count",
            "clip.vision.sam.embedding_length", "clip.vision.sam.head_count", "clip.vision.spatial_merge_size",
            "clip.vision.expert_used_count", "clip.vision.n_wa_pattern"
        };
        for (const char * m : { "vision", "audio" }) {
            for (const char * k : { "block_count", "embedding_length", "attention.head_dim", "feed_forward_length",
                                    "attention.head_count", "attention.head_count_kv", "projection_dim" }) {
                s.insert(std::string("clip.") + m + "." + k);
            }
        }
        return s;
    }();
    if (strings.count(k)) {
        return GGUF_TYPE_STRING;
    }
    if (bools.count(k)) {
        return GGUF_TYPE_BOOL;
    }
    if (u32.count(k)) {
        return GGUF_TYPE_UINT32;
    }
    if (k == "clip.minicpmv_version") {
        return GGUF_TYPE_INT32;
    }
    if (k == "clip.vision.attention.layer_norm_epsilon" || k == "clip.audio.attention.layer_norm_epsilon") {
        return GGUF_TYPE_FLOAT32;
    }
    return GGUF_TYPE_COUNT;
}

// The projector types ecokv is tested on (tests/llama/tiny-mmproj.h), with what their tensors look like.
struct projector_traits {
    bool merger      = false;  // Qwen2-VL's family: two patch kernels, no learned positions, 2x2 patches merged
    bool rms_blocks  = false;  // Qwen2.5-VL: RMSNorm, gated FFN, Q/K/V biases the graph needs
    bool class_token = false;  // a class embedding (and a position for it)
    bool positions   = false;  // learned positions, required
    bool shuffle     = false;  // pixel shuffle by clip.vision.projector.scale_factor (InternVL, Idefics3)
    bool pooled      = false;  // Gemma 3: average pooling, soft-embedding norm, a projection stored [n_out, n_embd]
    bool fused_qkv   = false;  // Qwen3-VL: one Q/K/V matrix, deepstack mergers
};

std::optional<projector_traits> traits_of(const std::string & type) {
    if (type == "qwen2vl_merger" || type == "qwen2.5vl_merger") {
        return projector_traits{ .merger = true, .rms_blocks = type == "qwen2.5vl_merger" };
    }
    if (type == "qwen3vl_merger") {
        return projector_traits{ .merger = true, .positions = true, .fused_qkv = true };
    }
    if (type == "mlp") {
        return projector_traits{ .class_token = true, .positions = true };
    }
    if (type == "internvl") {
        return projector_traits{ .class_token = true, .positions = true, .shuffle = true };
    }
    if (type == "idefics3") {
        return projector_traits{ .shuffle = true };
    }
    if (type == "gemma3") {
        return projector_traits{ .pooled = true };
    }
    return std::nullopt;
}

// The projector from the ViT's width to the text model's (n_out).
void check_projector(const gguf_file & f, const std::string & type, const projector_traits & t, int64_t n_embd,
                     int64_t grid, int64_t n_out) {
    if (t.merger) {  // 2x2 neighbouring patches merged into one token: [4 n_embd] -> [4 n_embd] -> [n_out]
        const int64_t m = n_embd * 4;
        f.expect("mm.0.weight", { m, m });
        f.expect("mm.0.bias", { m });
        f.expect("mm.2.weight", { m, n_out });
        f.expect("mm.2.bias", { n_out });
    } else if (t.pooled) {
        const int64_t k = f.u32("clip.vision.projector.scale_factor", 1, 64, 4);  // mtmd's default pooling
        if (grid % k != 0) {
            f.fail("the pooling's kernel " + std::to_string(k) + " must divide the " + std::to_string(grid) +
                   " patches of a side");
        }
        f.expect("mm.soft_emb_norm.weight", { n_embd });
        f.expect("mm.input_projection.weight", { n_out, n_embd });
    } else if (t.shuffle) {  // s x s patches stacked into one token of s^2 n_embd values
        const int64_t sf = f.u32("clip.vision.projector.scale_factor", 1, 64, 1);
        if (sf < (type == "idefics3" ? 2 : 1) || grid % sf != 0) {
            f.fail("the pixel shuffle's scale factor " + std::to_string(sf) + " must be " +
                   (type == "idefics3" ? "at least 2 and " : "") + "divide the " + std::to_string(grid) +
                   " patches of a side");
        }
        const int64_t m = n_embd * sf * sf;
        if (type == "idefics3") {
            f.expect("mm.model.fc.weight", { m, n_out });
            return;
        }
        f.expect("mm.model.mlp.0.weight", { m });
        f.expect("mm.model.mlp.0.bias", { m });
        f.expect("mm.model.mlp.1.weight", { m, n_out });
        f.expect("mm.model.mlp.1.bias", { n_out });
        f.expect("mm.model.mlp.3.weight", { n_out, n_out });
        f.expect("mm.model.mlp.3.bias", { n_out });
    } else {  // LLaVA's two-layer MLP: [n_embd] -> [hidden] -> [n_out]
        const ggml_tensor * up = f.tensor("mm.0.weight");
        if (up == nullptr) {
            f.fail("tensor 'mm.0.weight' is missing");
        }
        const int64_t hidden = up->ne[1];
        f.expect("mm.0.weight", { n_embd, hidden });
        f.expect("mm.0.bias", { hidden });
        f.expect("mm.2.weight", { hidden, n_out });
        f.expect("mm.2.bias", { n_out });
    }
}

// LLaVA-NeXT's tiles: (width, height) pairs of whole tiles, as an INT32 array (what mtmd reads).
void check_pinpoints(const gguf_file & f, int64_t image) {
    const int64_t id = f.key("clip.vision.image_grid_pinpoints");
    if (id < 0) {
        return;
    }
    f.expect_type(id, GGUF_TYPE_ARRAY, GGUF_TYPE_INT32);
    const size_t    n = gguf_get_arr_n(f.ctx(), id);
    const int32_t * v = static_cast<const int32_t *>(gguf_get_arr_data(f.ctx(), id));
    if (n == 0 || n % 2 != 0) {
        f.fail("key 'clip.vision.image_grid_pinpoints' holds " + std::to_string(n) + " values, not (width, height) pairs");
    }
    for (size_t i = 0; i < n; ++i) {
        if (v[i] <= 0 || v[i] % image != 0) {  // a partial tile is not square: mtmd's llava graph aborts
            f.fail("key 'clip.vision.image_grid_pinpoints' holds " + std::to_string(v[i]) +
                   ", not a multiple of the image size " + std::to_string(image));
        }
    }
}

// The vision tower (ViT blocks) and the projector of the projector types ecokv is tested on.
void check_vision(const gguf_file & f, const std::string & type, const projector_traits & t, int64_t n_embd_model) {
    const int64_t n_embd  = f.u32("clip.vision.embedding_length", 1, 1 << 14);
    const int64_t n_head  = f.u32("clip.vision.attention.head_count", 1, 256);
    const int64_t n_ff    = f.u32("clip.vision.feed_forward_length", 1, 1 << 16);
    const int64_t n_layer = f.u32("clip.vision.block_count", 1, 256);
    const int64_t n_out   = f.u32("clip.vision.projection_dim", 1, 1 << 16);
    const int64_t patch   = f.u32("clip.vision.patch_size", 1, 64);
    const int64_t image   = f.u32("clip.vision.image_size", patch, 4096);
    if (n_embd % n_head != 0) {
        f.fail("the vision width " + std::to_string(n_embd) + " is not a multiple of " + std::to_string(n_head) +
               " heads");
    }
    if (n_embd_model > 0 && n_out != n_embd_model) {
        f.fail("the projector's output width is " + std::to_string(n_out) + ", the model's embedding width " +
               std::to_string(n_embd_model) + " (not made for this model?)");
    }
    check_pinpoints(f, image);
    const int64_t grid = image / patch;
    f.expect("v.patch_embd.weight", { patch, patch, 3, n_embd });
    f.expect("v.patch_embd.weight.1", { patch, patch, 3, n_embd }, t.merger);
    f.expect("v.patch_embd.bias", { n_embd }, t.fused_qkv);  // Qwen3-VL's graph asserts it
    f.expect("v.class_embd", { n_embd }, t.class_token && type == "internvl");
    if (!t.merger || t.fused_qkv) {  // Qwen3-VL: learned positions too, interpolated to the image
        const int64_t cls = f.tensor("v.class_embd") ? 1 : 0;
        f.expect("v.position_embd.weight", { n_embd, grid * grid + cls }, t.positions);
    }
    for (const char * norm : { "v.pre_ln", "v.post_ln" }) {
        f.expect(std::string(norm) + ".weight", { n_embd }, false);
        f.expect(std::string(norm) + ".bias", { n_embd }, false);
    }
    for (int64_t il = 0; il < n_layer; ++il) {
        const std::string b = "v.blk." + std::to_string(il) + ".";
        if (t.fused_qkv) {  // the graph adds the bias unconditionally
            f.expect(b + "attn_qkv.weight", { n_embd, 3 * n_embd });
            f.expect(b + "attn_qkv.bias", { 3 * n_embd });
        }
        for (const char * w : { "attn_q", "attn_k", "attn_v", "attn_out" }) {
            const bool out = std::string(w) == "attn_out";
            f.expect(b + w + ".weight", { n_embd, n_embd }, out || !t.fused_qkv);
            f.expect(b + w + ".bias", { n_embd }, t.rms_blocks && !out);
        }
        for (const char * norm : { "ln1", "ln2" }) {
            f.expect(b + norm + ".weight", { n_embd });
            f.expect(b + norm + ".bias", { n_embd }, false);
        }
        for (const char * scale : { "ls1", "ls2" }) {
            f.expect(b + scale + ".weight", { n_embd }, false);
        }
        f.expect(b + "ffn_gate.weight", { n_embd, n_ff }, false);
        f.expect(b + "ffn_up.weight", { n_embd, n_ff });
        f.expect(b + "ffn_up.bias", { n_ff }, false);
        f.expect(b + "ffn_down.weight", { n_ff, n_embd });
        f.expect(b + "ffn_down.bias", { n_embd }, false);
    }
    if (t.fused_qkv) {  // deepstack mergers after some blocks: [4 n_embd] -> [4 n_embd] -> [n_out] each
        for (int64_t il = 0; il < n_layer; ++il) {
            const std::string d = "v.deepstack." + std::to_string(il) + ".";
            const bool        present = f.tensor(d + "fc1.weight") != nullptr;
            f.expect(d + "norm.weight", { 4 * n_embd }, present);
            f.expect(d + "fc1.weight", { 4 * n_embd, 4 * n_embd }, present);
            f.expect(d + "fc2.weight", { 4 * n_embd, n_out }, present);
        }
    }
    check_projector(f, type, t, n_embd, grid, n_out);
}

}  // namespace

void check_model_gguf(const std::string & path) {
    const gguf_file f(path);
    f.check_tensor_table();
    f.str("general.name");
    const std::string arch = f.str("general.architecture");
    if (arch.empty()) {
        f.fail("key 'general.architecture' is missing");
    }
    check_vocab(f);
    const int64_t tokens = f.key("tokenizer.ggml.tokens");
    if ((arch == "llama" || arch == "qwen2" || arch == "qwen2vl" || arch == "qwen3vl" || arch == "gemma3") && tokens >= 0) {
        check_decoder(f, arch, int64_t(gguf_get_arr_n(f.ctx(), tokens)));
    }
}

void check_projector_gguf(const std::string & path, int64_t n_embd_model) {
    const gguf_file f(path);
    f.check_tensor_table();
    for (int64_t id = 0; id < gguf_get_n_kv(f.ctx()); ++id) {
        if (const gguf_type t = clip_key_type(gguf_get_key(f.ctx(), id)); t != GGUF_TYPE_COUNT) {
            f.expect_type(id, t);
        }
    }
    const std::string type = f.str("clip.projector_type");
    if (const std::optional<projector_traits> t = traits_of(type)) {
        check_vision(f, type, *t, n_embd_model);
    }
}

}  // namespace ecokv::llama
