// session (ecokv/llama-session.h): the model and its projector, tokens and the chat template; the recipe every client
// used to spell out, written once. Prompts, sequences, chunked prefill and snapshots have files of their own
// (prompt.cpp, sequence.cpp, chunked-prefill.cpp, snapshot.cpp) around the state they share (session-impl.h).
#include "devices.h"
#include "ecokv/error.h"
#include "ecokv/llama-options.h"
#include "gguf-check.h"
#include "kv-store.h"
#include "session-impl.h"

#include <mtmd-helper.h>
#include <mtmd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace ecokv::llama {

namespace {

bool g_verbose = false;

void log_filter(ggml_log_level level, const char * text, void *) {
    if (g_verbose || level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

}  // namespace

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

llama_context_params context_params(const session_options & o, int32_t n_cells) {
    llama_context_params p = llama_context_default_params();
    p.n_ctx                = uint32_t(n_cells);
    p.n_batch              = uint32_t(std::min(n_cells, o.n_batch));
    if (o.n_ubatch > 0) {
        p.n_ubatch = uint32_t(std::min(o.n_ubatch, int32_t(p.n_batch)));
    }
    p.n_seq_max       = 1;
    p.swa_full        = false;  // an iSWA model's sliding-window layers hold their window only, as llama-server's
    p.flash_attn_type = o.flash_attn;
    p.type_k          = o.type_k;
    p.type_v          = o.type_v;
    p.n_threads       = o.n_threads > 0 ? o.n_threads : default_thread_count();
    p.n_threads_batch = o.n_threads_batch > 0 ? o.n_threads_batch : p.n_threads;
    return p;
}

context_ptr new_context(const llama_model * model, const llama_context_params & p) {
    context_ptr ctx(llama_init_from_model(const_cast<llama_model *>(model), p));
    if (!ctx) {
        throw error("cannot create a context of " + std::to_string(p.n_ctx) + " cells");
    }
    return ctx;
}

void set_verbose(bool verbose) {
    g_verbose = verbose;
    llama_log_set(log_filter, nullptr);
    mtmd_helper_log_set(log_filter, nullptr);
}

namespace {

model_ptr load_model(const session_options & o) {
    const std::string & path = o.model_path;
    if (!std::filesystem::is_regular_file(path)) {
        throw error(path + ": no such model file");
    }
    check_model_gguf(path);
    llama_backend_init();
    const std::vector<ggml_backend_dev_t> devices = offload_devices(o);
    model_ptr model(llama_model_load_from_file(path.c_str(), model_params(o, devices)));
    if (!model) {
        throw error(path + ": cannot load the model (not a GGUF llama.cpp 0.5.0 can read?)");
    }
    return model;
}

std::unique_ptr<mtmd_context, mtmd_deleter> load_projector(const session_options & o, const llama_model * model) {
    const std::string & path = o.mmproj_path;
    if (!std::filesystem::is_regular_file(path)) {
        throw error(path + ": no such mmproj file");
    }
    check_projector_gguf(path, llama_model_n_embd(model));
    mtmd_context_params mp = mtmd_context_params_default();
    mp.print_timings = mp.warmup = false;
    // On the first offload device, as llama.cpp's --mmproj-device follows --device; none with --device none.
    const std::vector<ggml_backend_dev_t> devices = offload_devices(o);
    mp.use_gpu = o.mmproj_offload && (devices.empty() || projector_device(devices) != nullptr);
    mp.device  = mp.use_gpu ? projector_device(devices) : nullptr;
    if (o.image_max_tokens > 0) {
        mp.image_max_tokens = o.image_max_tokens;
    }
    mp.n_threads = o.n_threads > 0 ? o.n_threads : default_thread_count();
    std::unique_ptr<mtmd_context, mtmd_deleter> p(mtmd_init_from_file(path.c_str(), model, mp));
    if (!p) {
        throw error(path + ": cannot load the projector (corrupt, or not made for this model?)");
    }
    return p;
}

}  // namespace

void projector_pool::add(context c) {
    all_.push_back(std::move(c));
    held_.push_back(false);
}

projector_pool::lease projector_pool::take() const {
    std::unique_lock<std::mutex> lock(mutex_);
    std::vector<bool>::iterator  free;
    freed_.wait(lock, [&] { return (free = std::find(held_.begin(), held_.end(), false)) != held_.end(); });
    *free = true;
    return lease(*this, size_t(free - held_.begin()));
}

projector_pool::lease::~lease() {
    {
        const std::lock_guard<std::mutex> lock(pool_->mutex_);
        pool_->held_[i_] = false;
    }
    pool_->freed_.notify_one();
}

session::session(const session_options & options) : impl_(std::make_unique<impl>()) {
    impl_->opts  = options;
    impl_->owned = load_model(options);
    impl_->model = impl_->owned.get();
    check_cache_types(impl_->model, options);
    if (!options.mmproj_path.empty()) {
        for (int32_t i = 0; i < std::max(1, options.n_projectors); ++i) {
            impl_->projectors.add(load_projector(options, impl_->model));
        }
    }
}

session::session(model_ptr model, const session_options & options) : impl_(std::make_unique<impl>()) {
    if (!model) {
        throw error("session: no model");
    }
    check_cache_types(model.get(), options);
    impl_->opts  = options;
    impl_->owned = std::move(model);
    impl_->model = impl_->owned.get();
}

session::session(llama_model & model, const session_options & options) : impl_(std::make_unique<impl>()) {
    check_cache_types(&model, options);
    impl_->opts  = options;
    impl_->model = &model;
}

session::~session() = default;

const llama_model *     session::model() const { return impl_->model; }
bool                    session::has_projector() const { return !impl_->projectors.empty(); }
int32_t                 session::n_ctx_train() const { return llama_model_n_ctx_train(impl_->model); }
int32_t                 session::n_ctx() const { return impl_->opts.n_ctx > 0 ? impl_->opts.n_ctx : n_ctx_train(); }

void check_fits(const session & s, int64_t n_cells, int32_t n_extra) {
    if (n_cells + n_extra > s.n_ctx()) {
        throw error("prompt of " + std::to_string(n_cells) + " tokens plus " + std::to_string(n_extra) +
                    " new ones exceeds " + (s.options().n_ctx > 0 ? engine_option_name("ctx_size") + " " : "the model's context of ") +
                    std::to_string(s.n_ctx()));
    }
}
const session_options & session::options() const { return impl_->opts; }

std::string session::description() const {
    char desc[256] = {};
    llama_model_desc(impl_->model, desc, sizeof desc);
    return desc;
}

std::vector<llama_token> session::tokenize(const std::string & text, bool add_special) const {
    return llama::tokenize(impl_->model, text, add_special);
}

std::string session::detokenize(const std::vector<llama_token> & tokens) const {
    return llama::detokenize(impl_->model, tokens);
}

std::string session::chat_prompt(const std::string & user) const { return llama::chat_prompt(impl_->model, user); }

std::string session::chat_text(const std::vector<chat_message> & messages) const {
    return llama::chat_text(impl_->model, messages);
}

bool session::is_end_of_generation(llama_token token) const {
    return llama_vocab_is_eog(llama_model_get_vocab(impl_->model), token);
}

prompt_parts session::split_prompt(const std::string & context) const {
    const std::string marker   = "\x01" "ECOKV_QUESTION" "\x01";
    const std::string rendered = chat_prompt(context + "\n" + marker);
    const size_t      at       = rendered.find(marker);
    if (at == std::string::npos) {
        return { context + "\n", "" };
    }
    return { rendered.substr(0, at), rendered.substr(at + marker.size()) };
}

}  // namespace ecokv::llama
