#include "common/session.h"

#include "ecokv/error.h"
#include "ecokv/llama-generate.h"

#include <mtmd-helper.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

namespace ecokv::tools {

namespace {

bool g_verbose = false;

void log_filter(ggml_log_level level, const char * text, void *) {
    if (g_verbose || level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

struct bitmap_deleter {
    void operator()(mtmd_bitmap * b) const { mtmd_bitmap_free(b); }
};

}  // namespace

void set_llama_verbose(bool verbose) {
    g_verbose = verbose;
    llama_log_set(log_filter, nullptr);
    mtmd_helper_log_set(log_filter, nullptr);
}

model_ptr load_model(const std::string & path) {
    if (!std::filesystem::is_regular_file(path)) {
        throw error(path + ": no such model file");
    }
    llama_backend_init();
    model_ptr model(llama_model_load_from_file(path.c_str(), llama_model_default_params()));
    if (!model) {
        throw error(path + ": cannot load the model (not a GGUF llama.cpp 0.5.0 can read?)");
    }
    return model;
}

projector_ptr load_projector(const std::string & path, llama_model * model, int32_t n_threads) {
    if (!std::filesystem::is_regular_file(path)) {
        throw error(path + ": no such mmproj file");
    }
    mtmd_context_params mp = mtmd_context_params_default();
    mp.use_gpu = mp.print_timings = mp.warmup = false;
    if (n_threads > 0) {
        mp.n_threads = n_threads;
    }
    projector_ptr p(mtmd_init_from_file(path.c_str(), model, mp));
    if (!p) {
        throw error(path + ": cannot load the projector (corrupt, or not made for this model?)");
    }
    return p;
}

prompt_parts split_prompt(const llama_model * model, const std::string & context) {
    const std::string marker   = "\x01" "ECOKV_QUESTION" "\x01";
    const std::string rendered = llama::chat_prompt(model, context + "\n" + marker);
    const size_t      at       = rendered.find(marker);
    if (at == std::string::npos) {
        return { context + "\n", "" };
    }
    return { rendered.substr(0, at), rendered.substr(at + marker.size()) };
}

std::string with_media_markers(std::string text, size_t n_images) {
    if (n_images == 0 || text.find(mtmd_default_marker()) != std::string::npos) {
        return text;
    }
    std::string markers;
    for (size_t i = 0; i < n_images; ++i) {
        markers += std::string(mtmd_default_marker()) + "\n";
    }
    return markers + text;
}

prompt::prompt(llama_model * model, mtmd_context * projector, std::string text, const std::vector<std::string> & images) :
    model_(model),
    projector_(projector) {
    if (images.empty()) {
        tokens_  = llama::tokenize(model, text, true);
        n_cells_ = int32_t(tokens_.size());
        return;
    }
    if (projector == nullptr) {
        throw error("images need a projector (--mmproj)");
    }
    std::vector<std::unique_ptr<mtmd_bitmap, bitmap_deleter>> bitmaps;
    std::vector<const mtmd_bitmap *>                          ptrs;
    for (const std::string & path : images) {
        bitmaps.emplace_back(
            mtmd_helper_bitmap_init_from_file(projector, path.c_str(), false, mtmd_helper_init_opt_default()).bitmap);
        if (!bitmaps.back()) {
            throw error(path + ": cannot read the image");
        }
        ptrs.push_back(bitmaps.back().get());
    }
    chunks_.reset(mtmd_input_chunks_init());
    const mtmd_input_text input{ text.c_str(), text.size(), true, true };
    if (const int32_t rc = mtmd_tokenize(projector, chunks_.get(), &input, ptrs.data(), ptrs.size()); rc != 0) {
        throw error(rc == 1 ? "the prompt's media markers do not match the number of images"
                            : "an image could not be preprocessed for this projector");
    }
    n_cells_ = int32_t(mtmd_helper_get_n_tokens(chunks_.get()));
}

prompt::~prompt() = default;

prefill_result prompt::prefill(llama_context * ctx) const {
    const auto     t0 = std::chrono::steady_clock::now();
    prefill_result r;
    if (!chunks_) {
        r.first_logits = llama::decode(ctx, tokens_, 0);
        r.n_tokens = r.n_past = n_cells_;
    } else {
        for (size_t i = 0; i < mtmd_input_chunks_size(chunks_.get()); ++i) {
            const mtmd_input_chunk * c    = mtmd_input_chunks_get(chunks_.get(), i);
            const auto               type = mtmd_input_chunk_get_type(c);
            const uint8_t m = type == MTMD_INPUT_CHUNK_TYPE_TEXT ? 0 : type == MTMD_INPUT_CHUNK_TYPE_IMAGE ? 1 : 2;
            const size_t  n = mtmd_input_chunk_get_n_tokens(c);
            r.modality.insert(r.modality.end(), n, m);
            r.n_media += m != 0 ? int32_t(n) : 0;
        }
        llama_pos n_past = 0;
        if (mtmd_helper_eval_chunks(projector_, ctx, chunks_.get(), 0, 0, int32_t(llama_n_batch(ctx)), true, &n_past) != 0) {
            throw error("evaluating the multimodal prompt failed");
        }
        r.first_logits = llama::last_logits(ctx);
        r.n_tokens = n_cells_;
        r.n_past   = int32_t(n_past);
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
}

llama_context_params context_params(int32_t n_cells, int32_t n_threads) {
    llama_context_params p = llama_context_default_params();
    p.n_ctx                = uint32_t(n_cells);
    p.n_batch              = uint32_t(std::min(n_cells, 2048));
    p.n_seq_max            = 1;
    if (n_threads > 0) {
        p.n_threads = p.n_threads_batch = n_threads;
    }
    return p;
}

std::vector<uint8_t> save_state(llama_context * ctx) {
    std::vector<uint8_t> s(llama_state_seq_get_size(ctx, 0));
    if (s.empty() || llama_state_seq_get_data(ctx, s.data(), s.size(), 0) != s.size()) {
        throw error("cannot save the sequence state");
    }
    return s;
}

void restore_state(llama_context * ctx, const std::vector<uint8_t> & state) {
    llama_memory_clear(llama_get_memory(ctx), true);
    if (llama_state_seq_set_data(ctx, state.data(), state.size(), 0) != state.size()) {
        throw error("cannot restore the sequence state");
    }
}

}  // namespace ecokv::tools
