// Test support: tiny random-weight mmproj (vision projector) GGUF files that llama.cpp 0.5.0's libmtmd loads
// unchanged, plus deterministic test images. Pairs with tests/llama/tiny-model.h:
//   - mmproj_type::qwen2vl_merger (Qwen2-VL ViT + 2x2 patch merger) with a tiny_model of arch "qwen2vl";
//   - mmproj_type::llava_mlp (LLaVA-1.5: CLIP ViT + mm.0/mm.2 two-layer MLP) with a tiny_model of arch "llama".
// n_embd_text must equal the text model's n_embd, or mtmd_init_from_file() fails (returns nullptr).
//
// What mtmd 0.5.0 requires of the file (tools/mtmd/clip.cpp load_hparams / load_tensors):
//   keys: clip.has_vision_encoder = true, clip.projector_type, clip.vision.{image_size, patch_size,
//         embedding_length, feed_forward_length, block_count, projection_dim, attention.head_count,
//         attention.layer_norm_epsilon}, clip.vision.image_mean / image_std (>= 3 floats each);
//   tensors (per block): v.blk.N.{attn_out.weight, ffn_up.weight, ffn_down.weight}; qwen2vl_merger:
//         mm.{0,2}.{weight,bias}. Everything else is "optional" to the loader, but the graphs dereference
//         v.patch_embd.weight(.1), v.blk.N.attn_{q,k,v}.{weight,bias} (qwen2vl), v.position_embd.weight and
//         mm.2.weight (llava): leaving those out segfaults (at encode, or in mtmd_init_from_file for mm.2.weight).
// Pairing: the projector output width (mm.2 rows) is compared with llama_model_n_embd_inp(text model) only when a
// text model is passed to mtmd_init_from_file; a mismatch logs "mismatch between text model (n_embd = T) and mmproj
// (n_embd = P)" and returns nullptr.
#pragma once

#include "tiny-model.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

struct gguf_context;
struct mtmd_bitmap;

namespace ecokv::test {

enum class mmproj_type {
    qwen2vl_merger,   // clip.projector_type "qwen2vl_merger"
    llava_mlp,        // clip.projector_type "mlp" (LLaVA-1.5)
    llava_next,       // "mlp" with clip.vision.image_grid_pinpoints (LLaVA-NeXT / 1.6: anyres tiles)
    qwen25vl_merger,  // "qwen2.5vl_merger" (Qwen2.5-VL: RMSNorm, gated FFN, window attention)
    internvl,         // "internvl" (InternVL 2.5 / 3: InternViT, pixel shuffle, tiles)
    idefics3,         // "idefics3" (Idefics3 / SmolVLM: SigLIP, pixel shuffle, tiles with text between them)
    gemma3,           // "gemma3" (Gemma 3: SigLIP, average pooling, soft-embedding norm; images attend non-causally)
    qwen3vl_merger,   // "qwen3vl_merger" (Qwen3-VL: learned and M-RoPE positions, deepstack features)
};

const char * mmproj_type_name(mmproj_type t);  // the clip.projector_type string

struct tiny_mmproj_config {
    mmproj_type type = mmproj_type::qwen2vl_merger;
    // llava_mlp: every image is resized to image_size x image_size, giving (image_size/patch_size)^2 tokens.
    // qwen2vl_merger: only metadata (mtmd sizes Qwen2-VL images dynamically, see expected_image_geometry()).
    int32_t image_size  = 56;
    int32_t patch_size  = 14;
    int32_t n_embd      = 32;  // vision tower width; n_embd / n_head must be a multiple of 4 for qwen2vl (M-RoPE)
    int32_t n_block     = 1;   // ViT blocks (llava_mlp runs n_block - 1 of them: it takes the penultimate layer)
    int32_t n_head      = 2;
    int32_t n_ff        = 64;  // must differ from n_embd (mtmd swaps ffn_up/ffn_down of "legacy" files otherwise)
    int32_t n_embd_text = 64;  // projector output = clip.vision.projection_dim; must equal the text model's n_embd
    uint64_t seed       = 1;
    // llava_next: (width, height) pairs, multiples of image_size (a smaller edge tile aborts the llava graph)
    std::vector<int32_t> grid_pinpoints = { 56, 112, 112, 56, 112, 112 };
    int32_t n_wa_pattern       = 2;    // qwen25vl_merger: every n-th ViT block attends globally, the others by window
    // internvl / idefics3: pixel shuffle; gemma3: average pooling (mtmd's default 4 when not written); must divide
    // image_size / patch_size
    int32_t scale_factor       = 2;
    // qwen3vl_merger: the ViT blocks after which a deepstack merger adds features (the text model's
    // n_deepstack_layers must be their count: the output is n_embd_text * (1 + count) wide)
    std::vector<int32_t> deepstack_blocks = { 0 };
    int32_t preproc_image_size = 128;  // idefics3: the longest side images are resized to before tiling
    // Negative tests: metadata keys (e.g. "clip.vision.patch_size") or tensor names (e.g. "mm.2.bias") to leave
    // out of the file. Unknown names are ignored.
    std::vector<std::string> omit;
};

// Writes the GGUF: F16 patch embeddings, F32 everything else; 211 KB (qwen2vl_merger) / 102 KB (llava_mlp) at the
// defaults. Deterministic in the config: each tensor is filled from (seed, tensor name) with a platform-independent
// generator:
//   linear weights N(0, 1/sqrt(fan_in)); biases N(0, 0.02); norm weights 1 + N(0, 0.1), norm biases N(0, 0.02);
//   patch embeddings N(0, 1/sqrt(3 p^2)); llava class/position embeddings N(0, 0.2).
// Throws std::invalid_argument on a bad config, std::runtime_error when the file cannot be written.
void write_tiny_mmproj(const std::string & path, const tiny_mmproj_config & c);

// The tensor names write_tiny_mmproj() writes for c, in file order, before `omit` is applied.
std::vector<std::string> tiny_mmproj_tensor_names(const tiny_mmproj_config & c);

// A unique path under std::filesystem::temp_directory_path(), "<prefix>-<pid>-<counter>.gguf"; nothing is created.
// Writes a copy of the GGUF file `src` to `dst` through `dst`.part and a rename (so `dst` may be `src`): its keys with
// `edit` applied, its tensors with those named in `reshape` given the new shapes (zero data).
void rewrite_gguf(const std::string & src, const std::string & dst, const std::function<void(gguf_context *)> & edit,
                  const std::map<std::string, std::vector<int64_t>> & reshape = {});

std::string temp_gguf_path(const std::string & prefix = "ecokv-tiny-mmproj");

// RAII: removes the file (if any) at destruction.
class temp_file {
  public:
    explicit temp_file(std::string path) : path_(std::move(path)) {}
    temp_file(const temp_file &)             = delete;
    temp_file & operator=(const temp_file &) = delete;
    ~temp_file();
    const std::string & path() const { return path_; }
    const char *        c_str() const { return path_.c_str(); }

  private:
    std::string path_;
};

// temp_gguf_path() + write_tiny_mmproj(); the file is deleted when the returned object goes away.
std::unique_ptr<temp_file> write_tiny_mmproj_temp(const tiny_mmproj_config & c);

// What mtmd 0.5.0 makes of an nx-by-ny input image (computed independently of mtmd, from its preprocessing rules):
//   llava_mlp:       resized to image_size^2; g = image_size / patch_size; n_tokens = g*g; one row of tokens
//                    (tokens_x = n_tokens, tokens_y = 1); n_pos = n_tokens (1-D positions).
//   qwen2vl_merger:  resized to (W, H), multiples of a = 2*patch_size: W = max(a, round(nx/a)*a), same for H, then
//                    scaled up (ceil) if W*H < 8 merged tokens * a^2 or down (floor) if > 4096 * a^2;
//                    tokens_x = W/a, tokens_y = H/a, n_tokens = tokens_x*tokens_y, n_pos = max(tokens_x, tokens_y)
//                    (M-RoPE: every image token gets t = pos0, y = pos0 + row, x = pos0 + col).
struct image_geometry {
    int32_t width = 0, height = 0;      // preprocessed image in pixels
    int32_t tokens_x = 0, tokens_y = 0; // as mtmd_image_tokens nx / ny
    int32_t n_tokens = 0;               // embeddings (KV cells) the image occupies
    int32_t n_pos    = 0;               // positions it advances n_past by
};

//   qwen25vl_merger, qwen3vl_merger: as qwen2vl_merger;
//   gemma3: resized to image_size^2 (aspect kept, padded), (image_size / patch_size / scale_factor)^2 tokens.
// Tiled projectors make several chunks of one image, each a row of tokens with 1-D positions (expected_image_layout).
struct image_layout {
    // In prompt order: the tiles row-major, then the overview (last in mtmd 0.5.0 for all three tiled projectors).
    std::vector<image_geometry> chunks;
    int32_t tiles_x = 0, tiles_y = 0;  // 0: the image is one chunk
    int32_t n_tokens() const;          // embeddings of all chunks
};

// What mtmd 0.5.0 makes of an nx-by-ny image, from its preprocessing rules (computed independently of mtmd):
//   llava_next, internvl: llava-uhd slicing: an image within image_size^2 is one chunk (the overview); otherwise the
//       candidate resolution (pinpoints; InternVL a x b tiles, a b <= 12) showing most of the image, then with the
//       least padding, cut into image_size tiles, then the overview; (image_size/patch_size)^2 tokens per chunk
//       (internvl: divided by scale_factor^2);
//   idefics3: the longest side resized to preproc_image_size, the other in proportion (made even), rounded up to
//       whole tiles; always the tiles then the overview, (image_size/patch_size/scale_factor)^2 tokens each;
//   the others: one chunk, expected_image_geometry.
// image_min_tokens / image_max_tokens: as mtmd_context_params (values <= 0 keep the defaults 8 / 4096); they only
// affect qwen2vl_merger and qwen25vl_merger (idefics3 takes another path with them, not modelled here).
image_layout expected_image_layout(const tiny_mmproj_config & c, int32_t nx, int32_t ny, int32_t image_min_tokens = -1,
                                   int32_t image_max_tokens = -1);

// The geometry of an image mtmd keeps in one chunk; throws std::invalid_argument when it makes several.
image_geometry expected_image_geometry(const tiny_mmproj_config & c, int32_t nx, int32_t ny,
                                       int32_t image_min_tokens = -1, int32_t image_max_tokens = -1);

// A deterministic RGB image, nx*ny*3 bytes in RGBRGB... row-major order (mtmd_bitmap_init's layout): smooth colour
// gradients plus seeded noise, so neighbouring patches differ.
std::vector<uint8_t> make_test_image_rgb(int32_t nx, int32_t ny, uint64_t seed);

// make_test_image_rgb written as a binary PPM (P6), which mtmd reads from a file (stb_image).
void write_test_ppm(const std::string & path, int32_t nx, int32_t ny, uint64_t seed);

// A random-weight text model (arch, default shape) and a matching projector saved as GGUF files in `dir`:
// dir/model.gguf and dir/mmproj.gguf, for tests that run the ecokv binary.
struct tiny_vlm_files {
    std::string model, mmproj;
};
tiny_vlm_files write_tiny_vlm(const std::string & dir, const std::string & arch, mmproj_type type);

// The VLM families ecokv is tested on: the text model's arch and the projector, paired as the published GGUFs are.
struct vlm_family {
    const char * name;       // e.g. "llava-next"
    const char * arch;       // the text model's general.architecture
    mmproj_type  projector;
};
const std::vector<vlm_family> & vlm_families();

// A family's text model: its arch with the bpe tokenizer (n_vocab 300: every family's layout tokenizes, Idefics3's
// too), qwen3vl with one deepstack layer (the projector's one deepstack block); the rest tiny_config's defaults.
tiny_config vlm_text_config(const vlm_family & family);
// A family's projector: its type with 2 ViT blocks, the rest tiny_mmproj_config's defaults, output n_embd_text wide.
tiny_mmproj_config vlm_mmproj_config(const vlm_family & family, int32_t n_embd_text);

// The family's pair as GGUF files: make_tiny_model(vlm_text_config(family)) saved as dir/model.gguf and
// vlm_mmproj_config(family, its n_embd) as dir/mmproj.gguf. A tiny_model made in memory from vlm_text_config has the
// same weights as the file (weights are deterministic in the config), so a reference forward can check the file's.
tiny_vlm_files write_tiny_vlm(const std::string & dir, const vlm_family & family);

struct mtmd_bitmap_deleter {
    void operator()(mtmd_bitmap * b) const;  // mtmd_bitmap_free
};

using bitmap_ptr = std::unique_ptr<mtmd_bitmap, mtmd_bitmap_deleter>;

// mtmd_bitmap_init(nx, ny, make_test_image_rgb(nx, ny, seed).data()) (mtmd copies the pixels).
bitmap_ptr make_test_bitmap(int32_t nx, int32_t ny, uint64_t seed);

}  // namespace ecokv::test
