// The pre-flight check of model and projector files (adapters/llama/gguf-check): the bundled files pass; copies with
// one defect each (of the kinds that crashed llama.cpp's loaders) are refused with a message naming the file and the
// defect, written here by hand.
#include "gguf-check.h"

#include "ecokv/error.h"
#include "tiny-mmproj.h"

#include <ggml.h>
#include <gguf.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

namespace {

const std::string k_models = ECOKV_ROOT "/models/";
const std::string k_story  = k_models + "stories260K.gguf";
const std::string k_mmproj = k_models + "tiny-vlm-mmproj.gguf";

std::string temp_path(const std::string & name) {
    return (std::filesystem::temp_directory_path() / ("ecokv-gguf-check-" + std::to_string(::getpid()) + "-" + name))
        .string();
}

// A copy of `src` with `edit` applied to its key/values and the tensors of `reshape` given new shapes (zero data).
std::string rewrite(const std::string & src, const std::string & name,
                    const std::function<void(gguf_context *)> & edit,
                    const std::map<std::string, std::vector<int64_t>> & reshape = {}) {
    const std::string path = temp_path(name);
    ecokv::test::rewrite_gguf(src, path, edit, reshape);
    return path;
}

// The message check_* throws for `path`, or "" when it passes.
std::string problem(const std::function<void()> & check) {
    try {
        check();
    } catch (const ecokv::error & e) {
        return e.what();
    }
    return "";
}

TEST(gguf_check, the_bundled_files_pass) {
    EXPECT_EQ(problem([] { ecokv::llama::check_model_gguf(k_story); }), "");
    EXPECT_EQ(problem([] { ecokv::llama::check_model_gguf(k_models + "tiny-vlm.gguf"); }), "");
    EXPECT_EQ(problem([] { ecokv::llama::check_projector_gguf(k_mmproj, 128); }), "");
}

TEST(gguf_check, a_projector_for_another_width_is_refused) {
    EXPECT_EQ(problem([] { ecokv::llama::check_projector_gguf(k_mmproj, 64); }),
              k_mmproj + ": the projector's output width is 128, the model's embedding width 64 (not made for this "
                         "model?)");
}

TEST(gguf_check, a_vocabulary_entry_twice_is_refused) {
    const std::string path = rewrite(k_story, "dup.gguf", [](gguf_context * g) {
        const int64_t          id = gguf_find_key(g, "tokenizer.ggml.tokens");
        std::vector<std::string> words;
        for (size_t i = 0; i < gguf_get_arr_n(g, id); ++i) {
            words.emplace_back(gguf_get_arr_str(g, id, i));
        }
        words[7] = words[300];
        std::vector<const char *> c;
        for (const auto & w : words) {
            c.push_back(w.c_str());
        }
        gguf_set_arr_str(g, "tokenizer.ggml.tokens", c.data(), c.size());
    });
    const std::string word = problem([&] { ecokv::llama::check_model_gguf(path); });
    EXPECT_EQ(word.rfind(path + ": vocabulary token 300 ('", 0), 0u) << word;
    EXPECT_NE(word.find("') appears twice"), std::string::npos) << word;
    std::remove(path.c_str());
}

TEST(gguf_check, keys_of_the_wrong_type_or_size_are_refused) {
    const std::string a = rewrite(k_story, "type.gguf", [](gguf_context * g) { gguf_set_val_str(g, "llama.block_count", "5"); });
    EXPECT_EQ(problem([&] { ecokv::llama::check_model_gguf(a); }), a + ": key 'llama.block_count' is a str, expected a u32");
    const std::string b = rewrite(k_story, "kv.gguf", [](gguf_context * g) { gguf_set_val_u32(g, "llama.attention.head_count_kv", 3); });
    EXPECT_EQ(problem([&] { ecokv::llama::check_model_gguf(b); }), b + ": 8 attention heads cannot be grouped over 3 KV heads");
    const std::string c = rewrite(k_mmproj, "bool.gguf", [](gguf_context * g) { gguf_set_val_u32(g, "clip.use_gelu", 1); });
    EXPECT_EQ(problem([&] { ecokv::llama::check_projector_gguf(c, 128); }), c + ": key 'clip.use_gelu' is a u32, expected a bool");
    const std::string d = rewrite(k_story, "scores.gguf", [](gguf_context * g) {
        const float s[3] = { 0, 1, 2 };
        gguf_set_arr_data(g, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, s, 3);
    });
    EXPECT_EQ(problem([&] { ecokv::llama::check_model_gguf(d); }),
              d + ": key 'tokenizer.ggml.scores' has 3 entries for 512 tokens");
    for (const auto & p : { a, b, c, d }) {
        std::remove(p.c_str());
    }
}

TEST(gguf_check, tensors_of_the_wrong_shape_are_refused) {
    const std::string a = rewrite(k_story, "shape.gguf", [](gguf_context *) {}, { { "blk.2.attn_k.weight", { 64, 64 } } });
    EXPECT_EQ(problem([&] { ecokv::llama::check_model_gguf(a); }),
              a + ": tensor 'blk.2.attn_k.weight' has shape [64, 64, 1, 1], expected [64, 32] from the hyperparameters");
    const std::string b = rewrite(k_mmproj, "mm.gguf", [](gguf_context *) {}, { { "v.blk.1.ffn_down.weight", { 256, 64 } } });
    EXPECT_EQ(problem([&] { ecokv::llama::check_projector_gguf(b, 128); }),
              b + ": tensor 'v.blk.1.ffn_down.weight' has shape [256, 64, 1, 1], expected [256, 128] from the "
                  "hyperparameters");
    std::remove(a.c_str());
    std::remove(b.c_str());
}

TEST(gguf_check, truncated_and_foreign_files_are_refused) {
    const std::string cut = temp_path("cut.gguf");
    std::filesystem::copy_file(k_story, cut, std::filesystem::copy_options::overwrite_existing);
    const auto size = std::filesystem::file_size(k_story);
    std::filesystem::resize_file(cut, size - 100);
    // the last tensor's data ends at the original end of the file
    EXPECT_EQ(problem([&] { ecokv::llama::check_model_gguf(cut); }),
              cut + ": tensor 'blk.4.ffn_norm.weight' ends at byte " + std::to_string(size) + ", past the end of the " +
                  std::to_string(size - 100) + "-byte file (truncated?)");
    std::ofstream(cut, std::ios::trunc) << "GGUF but not really";
    EXPECT_EQ(problem([&] { ecokv::llama::check_model_gguf(cut); }),
              cut + ": not a readable GGUF file (its header, key/values or tensor table are malformed or truncated)");
    std::remove(cut.c_str());
}

// Every family's files pass (tiny-mmproj.h vlm_families), and one defect of the kind each family's loader takes on
// trust (a graph assert or a null tensor dereferenced while encoding) is refused by name.
TEST(gguf_check, the_families_pass_and_their_defects_are_refused) {
    const std::string dir = temp_path("families");
    std::filesystem::create_directories(dir);
    std::map<std::string, ecokv::test::tiny_vlm_files> files;
    for (const auto & f : ecokv::test::vlm_families()) {
        std::filesystem::create_directories(dir + "/" + f.name);
        files[f.name] = ecokv::test::write_tiny_vlm(dir + "/" + f.name, f);
        EXPECT_EQ(problem([&] { ecokv::llama::check_model_gguf(files[f.name].model); }), "") << f.name;
        EXPECT_EQ(problem([&] { ecokv::llama::check_projector_gguf(files[f.name].mmproj, 64); }), "") << f.name;
    }
    const std::string a = rewrite(files["llava-next"].mmproj, "pinpoints.gguf", [](gguf_context * g) {
        const int32_t p[4] = { 56, 60, 112, 56 };
        gguf_set_arr_data(g, "clip.vision.image_grid_pinpoints", GGUF_TYPE_INT32, p, 4);
    });
    EXPECT_EQ(problem([&] { ecokv::llama::check_projector_gguf(a, 64); }),
              a + ": key 'clip.vision.image_grid_pinpoints' holds 60, not a multiple of the image size 56");
    const std::string b = rewrite(files["smolvlm"].mmproj, "shuffle.gguf",
                                  [](gguf_context * g) { gguf_set_val_u32(g, "clip.vision.projector.scale_factor", 3); });
    EXPECT_EQ(problem([&] { ecokv::llama::check_projector_gguf(b, 64); }),
              b + ": the pixel shuffle's scale factor 3 must be at least 2 and divide the 4 patches of a side");
    const std::string c = rewrite(files["internvl3"].mmproj, "mlp.gguf", [](gguf_context *) {},
                                  { { "mm.model.mlp.1.weight", { 32, 64 } } });
    EXPECT_EQ(problem([&] { ecokv::llama::check_projector_gguf(c, 64); }),
              c + ": tensor 'mm.model.mlp.1.weight' has shape [32, 64, 1, 1], expected [128, 64] from the "
                  "hyperparameters");
    ecokv::test::tiny_mmproj_config no_bias;
    no_bias.type = ecokv::test::mmproj_type::qwen25vl_merger;
    no_bias.omit = { "v.blk.0.attn_q.bias" };
    const std::string d = temp_path("qbias.gguf");
    ecokv::test::write_tiny_mmproj(d, no_bias);
    EXPECT_EQ(problem([&] { ecokv::llama::check_projector_gguf(d, 64); }), d + ": tensor 'v.blk.0.attn_q.bias' is missing");
    ecokv::test::tiny_mmproj_config no_class;
    no_class.type = ecokv::test::mmproj_type::internvl;
    no_class.omit = { "v.class_embd" };
    const std::string e = temp_path("class.gguf");
    ecokv::test::write_tiny_mmproj(e, no_class);
    EXPECT_EQ(problem([&] { ecokv::llama::check_projector_gguf(e, 64); }), e + ": tensor 'v.class_embd' is missing");
    const std::string g = rewrite(files["gemma-3"].mmproj, "pool.gguf",
                                  [](gguf_context * x) { gguf_set_val_u32(x, "clip.vision.projector.scale_factor", 3); });
    EXPECT_EQ(problem([&] { ecokv::llama::check_projector_gguf(g, 64); }),
              g + ": the pooling's kernel 3 must divide the 4 patches of a side");
    ecokv::test::tiny_mmproj_config no_qkv_bias;
    no_qkv_bias.type = ecokv::test::mmproj_type::qwen3vl_merger;
    no_qkv_bias.omit = { "v.blk.0.attn_qkv.bias" };
    const std::string q = temp_path("qkv.gguf");
    ecokv::test::write_tiny_mmproj(q, no_qkv_bias);
    EXPECT_EQ(problem([&] { ecokv::llama::check_projector_gguf(q, 64); }), q + ": tensor 'v.blk.0.attn_qkv.bias' is missing");
    const std::string n = rewrite(files["gemma-3"].model, "norm.gguf", [](gguf_context *) {},
                                  { { "blk.1.post_ffw_norm.weight", { 32 } } });
    EXPECT_EQ(problem([&] { ecokv::llama::check_model_gguf(n); }),
              n + ": tensor 'blk.1.post_ffw_norm.weight' has shape [32, 1, 1, 1], expected [64] from the hyperparameters");
    for (const auto & p : { a, b, c, d, e, g, q, n }) {
        std::remove(p.c_str());
    }
    std::filesystem::remove_all(dir);
}

}  // namespace
