// What names a session's caches in an entry (ecokv/llama-entry.h): the model's fingerprint and the cache's shape.
#include "ecokv/llama-entry.h"
#include "session-impl.h"

#include <xxhash.h>

#include <fstream>

namespace ecokv::llama {

namespace {

// A file's fingerprint: its size, its first MiB (a GGUF's metadata and tensor table) and 16 blocks of 64 KiB evenly
// spaced through its weights, so that two fine-tunes of one architecture differ while a multi-GiB model is read in
// milliseconds.
void hash_file(XXH3_state_t * st, const std::string & path) {
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    const auto    size = uint64_t(f.tellg());
    XXH3_64bits_update(st, &size, sizeof size);
    std::vector<char> block;
    const auto        read = [&](uint64_t at, uint64_t n) {
        block.resize(size_t(std::min(n, size - std::min(at, size))));
        f.seekg(std::streamoff(at));
        f.read(block.data(), std::streamsize(block.size()));
        XXH3_64bits_update(st, block.data(), size_t(f.gcount()));
    };
    read(0, 1u << 20);
    for (uint64_t i = 0; i < 16 && size > 0; ++i) {
        read(size / 16 * i, 1u << 16);
    }
}

}  // namespace

uint64_t session::fingerprint() const {
    std::call_once(impl_->fingerprint_once, [this] { impl_->fingerprint = compute_fingerprint(); });
    return impl_->fingerprint;
}

uint64_t session::compute_fingerprint() const {
    XXH3_state_t * st = XXH3_createState();
    XXH3_64bits_reset(st);
    if (!impl_->opts.model_path.empty() && impl_->owned) {
        hash_file(st, impl_->opts.model_path);
    } else {  // a model built in memory: its metadata and sizes
        char buf[512];
        for (int32_t i = 0; i < llama_model_meta_count(impl_->model); ++i) {
            for (const bool key : { true, false }) {
                const int32_t n = key ? llama_model_meta_key_by_index(impl_->model, i, buf, sizeof buf)
                                      : llama_model_meta_val_str_by_index(impl_->model, i, buf, sizeof buf);
                XXH3_64bits_update(st, buf, size_t(std::clamp(n, 0, int32_t(sizeof buf) - 1)));
            }
        }
        const uint64_t sizes[2] = { llama_model_size(impl_->model), llama_model_n_params(impl_->model) };
        XXH3_64bits_update(st, sizes, sizeof sizes);
    }
    if (!impl_->opts.mmproj_path.empty()) {
        hash_file(st, impl_->opts.mmproj_path);
    }
    const uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
}

std::string session::cache_shape() const {
    const llama_model * m = impl_->model;
    const auto          flash = impl_->opts.flash_attn;
    return std::string("k=") + ggml_type_name(impl_->opts.type_k) + " v=" + ggml_type_name(impl_->opts.type_v) +
           " layers=" + std::to_string(llama_model_n_layer(m)) + " kv_heads=" + std::to_string(llama_model_n_head_kv(m)) +
           " embd=" + std::to_string(llama_model_n_embd(m)) + " heads=" + std::to_string(llama_model_n_head(m)) +
           " swa=" + std::to_string(llama_model_n_swa(m)) +
           " fa=" + (flash == LLAMA_FLASH_ATTN_TYPE_ENABLED ? "on" : flash == LLAMA_FLASH_ATTN_TYPE_DISABLED ? "off" : "auto");
}

}  // namespace ecokv::llama
