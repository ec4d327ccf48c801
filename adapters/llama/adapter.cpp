// prefill_state and compress_context: the cache of a prefilled context as an ecokv capture, and the ragged cache of
// what a method keeps (patches/llama.cpp: llama_kv_set_ragged).
#include "ecokv/error.h"
#include "ecokv/llama-adapter.h"
#include "kv-store.h"

#include <chrono>

namespace ecokv::llama {

struct prefill_state::impl {
    llama_context *              ctx = nullptr;
    std::unique_ptr<cache_views> cache;
    capture_view                 view;
    llama_pos                    n_past = 0;
    double                       seconds = 0;
    uint64_t                     bytes_to_host = 0;
};

namespace {

// LongRoPE picks its RoPE factors from the context size (llama_model::get_rope_factors): a smaller decode context
// could rotate new tokens with other factors than the cached keys.
bool uses_longrope(const llama_model * model) {
    char arch[64] = {}, type[64] = {};
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch);
    llama_model_meta_val_str(model, (std::string(arch) + ".rope.scaling.type").c_str(), type, sizeof type);
    return std::string(type) == "longrope";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

prefill_state::prefill_state(llama_context * ctx, const query_capture & capture, std::vector<uint8_t> modality,
                             int32_t n_prompt, llama_pos n_past, bool values) :
    impl_(std::make_unique<impl>()) {
    const auto t0 = std::chrono::steady_clock::now();
    const llama_model * model = llama_get_model(ctx);
    if (uses_longrope(model)) {
        throw error("LongRoPE models are not supported: their RoPE factors depend on the context size");
    }
    if (!capture.error().empty()) {
        throw error("query capture failed: " + capture.error());
    }
    if (capture.n_tokens() != n_prompt) {
        throw error("the query capture saw " + std::to_string(capture.n_tokens()) + " tokens but the prompt has " +
                    std::to_string(n_prompt) + " (attach the capture before the prefill, one sequence only)");
    }
    impl_->ctx    = ctx;
    impl_->n_past = n_past;
    impl_->cache  = std::make_unique<cache_views>(ctx, n_prompt, values);
    const cache_views & c = *impl_->cache;
    capture_view &      v = impl_->view;
    v.n_layers            = c.n_layers();
    v.n_heads             = llama_model_n_head(model);
    v.n_kv_heads          = llama_model_n_head_kv(model);
    v.head_dim            = int32_t(c.keys(0).ne[0]);
    v.head_dim_v          = int32_t(c.values(0).ne[0]);
    v.n_tokens            = n_prompt;
    v.n_queries           = int32_t(capture.queries(0).ne[1]);
    char desc[256]        = {};
    llama_model_desc(model, desc, sizeof desc);
    v.model = desc;
    const std::vector<int32_t> layers = compressed_layers(ctx);  // an iSWA model's global layers only
    for (int32_t il = 0; il < c.n_layers(); ++il) {
        const int32_t m = layers[size_t(il)];
        v.layers.push_back({ c.keys(il), c.values(il), capture.queries(m), capture.full_queries(m) });
        if (v.layers.back().queries.ne[1] != v.n_queries) {
            throw error("layer " + std::to_string(il) + " has no post-RoPE queries (models with RoPE-free or ALiBi "
                        "layers are not supported yet)");
        }
    }
    if (!modality.empty() && int32_t(modality.size()) != n_prompt) {
        throw error("modality map has " + std::to_string(modality.size()) + " entries for " + std::to_string(n_prompt) +
                    " prompt tokens");
    }
    v.modality = std::move(modality);
    v.validate();
    impl_->bytes_to_host = c.bytes_to_host() + capture.bytes_to_host();
    impl_->seconds       = seconds_since(t0);
}

prefill_state::~prefill_state() = default;

const capture_view & prefill_state::view() const { return impl_->view; }
llama_context *      prefill_state::context() const { return impl_->ctx; }
llama_pos            prefill_state::n_past() const { return impl_->n_past; }
double               prefill_state::seconds() const { return impl_->seconds; }
uint64_t             prefill_state::bytes_to_host() const { return impl_->bytes_to_host; }

compressed_cache compress_context(const llama_model * model, const prefill_state & state, const method_spec & spec,
                                  const method_params & params, int32_t n_extra, llama_context_params cparams,
                                  query_capture * observer, bool in_place) {
    compressed_cache out;
    out.capture_seconds = state.seconds();
    out.bytes_to_host   = state.bytes_to_host();
    auto             t0 = std::chrono::steady_clock::now();
    try {
        out.sel = compress(state.view(), spec, params, { int32_t(cparams.n_threads) });  // the context's threads
    } catch (const non_finite_error & e) {
        throw non_finite_error("the model '" + state.view().model + "' computed NaN or infinite values in its prefill (" +
                               e.what() + "): are its weights corrupt?");
    }
    out.select_seconds  = seconds_since(t0);

    t0                  = std::chrono::steady_clock::now();
    llama_context * ctx = state.context();
    if (!in_place) {
        // Its own cache is the smallest llama.cpp makes (256 cells), replaced by the ragged one right away; an iSWA
        // model's sliding-window cache holds the window besides the room.
        cparams.n_ctx     = uint32_t(std::max(n_extra, 1) + window_cells(model));
        cparams.n_seq_max = 1;
        cparams.cb_eval   = nullptr;
        if (observer != nullptr) {
            observer->attach(cparams);
        }
        out.ctx.reset(llama_init_from_model(const_cast<llama_model *>(model), cparams));
        if (!out.ctx) {
            throw error("cannot create the decode context");
        }
        ctx = out.ctx.get();
    }
    // The kept entries stand at the prompt's last position: the next token goes at n_past, as after the prompt.
    make_ragged(ctx, state.view(), out.sel, n_extra, state.n_past() - 1,
                { state.context(), state.view().n_kv_heads, {}, 0 });
    if (!in_place) {  // the sliding-window layers' cache as the prefill left it (less what was decoded since)
        write_window(ctx, read_window(state.context()));
        llama_memory_seq_rm(llama_get_memory(ctx), 0, state.n_past(), -1);
    }
    out.rebuild_seconds = seconds_since(t0);
    return out;
}

}  // namespace ecokv::llama
