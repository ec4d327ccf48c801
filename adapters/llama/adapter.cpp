// prefill_state and compress_context: the cache of a prefilled context as an ecokv capture, and the
// state-level rewrite into a smaller context (notes: llamacpp-0.5.0.md §4.2, option A).
#include "ecokv/error.h"
#include "ecokv/llama-adapter.h"
#include "state-blob.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace ecokv::llama {

struct prefill_state::impl {
    std::unique_ptr<state_blob> blob;
    capture_view                view;
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

// [n_layer][n_head][n_cells]: -INF on the padding cells of each query head's KV group, 0 elsewhere.
std::vector<float> padding_bias(const selection & sel, int32_t n_heads, int32_t n_cells) {
    const int32_t      n_kv  = int32_t(sel.layers[0].size());
    const int32_t      group = n_heads / n_kv;
    std::vector<float> bias(sel.layers.size() * n_heads * n_cells, 0.0f);
    for (size_t il = 0; il < sel.layers.size(); ++il) {
        for (int32_t h = 0; h < n_heads; ++h) {
            const int32_t kept = int32_t(sel.layers[il][h / group].kept.size());
            std::fill(bias.begin() + (il * n_heads + h) * n_cells + kept, bias.begin() + (il * n_heads + h + 1) * n_cells,
                      -INFINITY);
        }
    }
    return bias;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

prefill_state::prefill_state(llama_context * ctx, const query_capture & capture, std::vector<uint8_t> modality,
                             llama_seq_id seq, int32_t n_prompt) :
    impl_(std::make_unique<impl>()) {
    const llama_model * model = llama_get_model(ctx);
    const int32_t       n_kv  = llama_model_n_head_kv(model);
    if (uses_longrope(model)) {
        throw error("LongRoPE models are not supported: their RoPE factors depend on the context size");
    }
    if (!capture.error().empty()) {
        throw error("query capture failed: " + capture.error());
    }
    impl_->blob = std::make_unique<state_blob>(read_sequence(ctx, seq), uses_cell_ext(model), n_kv);
    if (n_prompt >= 0) {
        impl_->blob->keep_first(n_prompt);
    }
    const state_blob & b = *impl_->blob;
    if (capture.n_tokens() != b.n_cells()) {
        throw error("the query capture saw " + std::to_string(capture.n_tokens()) + " tokens but the cache holds " +
                    std::to_string(b.n_cells()) + " (attach the capture before the prefill, one sequence only)");
    }
    capture_view & v = impl_->view;
    v.n_layers       = b.n_layers();
    v.n_heads        = llama_model_n_head(model);
    v.n_kv_heads     = n_kv;
    v.head_dim       = b.head_dim_k();
    v.head_dim_v     = b.head_dim_v();
    v.n_tokens       = b.n_cells();
    v.n_queries      = int32_t(capture.queries(0).ne[1]);
    char desc[256]   = {};
    llama_model_desc(model, desc, sizeof desc);
    v.model = desc;
    for (int32_t il = 0; il < b.n_layers(); ++il) {
        v.layers.push_back({ b.keys(il), b.values(il), capture.queries(il), capture.full_queries(il) });
        if (v.layers.back().queries.ne[1] != v.n_queries) {
            throw error("layer " + std::to_string(il) + " has no post-RoPE queries (models with RoPE-free or ALiBi "
                        "layers are not supported yet)");
        }
    }
    if (!modality.empty() && int32_t(modality.size()) != b.n_cells()) {
        throw error("modality map has " + std::to_string(modality.size()) + " entries for " +
                    std::to_string(b.n_cells()) + " prompt tokens");
    }
    v.modality = std::move(modality);
    v.validate();
}

prefill_state::~prefill_state() = default;

const capture_view & prefill_state::view() const { return impl_->view; }

uint64_t prefill_state::kv_bytes_per_cell() const { return impl_->blob->bytes_per_cell(); }

int32_t prefill_state::pos_max() const { return impl_->blob->pos_max(); }

std::vector<uint8_t> prefill_state::compacted(const selection & sel, llama_seq_id seq) const {
    std::vector<std::vector<std::vector<int32_t>>> kept;
    for (const auto & layer : sel.layers) {
        auto & l = kept.emplace_back();
        for (const head_selection & h : layer) {
            l.push_back(h.kept);
        }
    }
    return impl_->blob->compacted(kept, seq);
}

uint64_t kv_bytes_allocated(const llama_context * ctx, uint64_t bytes_per_cell) {
    return uint64_t(llama_n_ctx(ctx)) * bytes_per_cell;
}

compressed_cache compress_context(const llama_model * model, const prefill_state & state, const method_spec & spec,
                                  const method_params & params, int32_t n_extra, llama_context_params cparams,
                                  query_capture * observer) {
    compressed_cache out;
    auto             t0 = std::chrono::steady_clock::now();
    out.sel             = compress(state.view(), spec, params);
    out.select_seconds  = seconds_since(t0);

    t0          = std::chrono::steady_clock::now();
    out.state   = state.compacted(out.sel);
    out.n_cells = 0;
    bool uniform = true;
    for (const auto & layer : out.sel.layers) {
        for (const head_selection & h : layer) {
            uniform     = uniform && h.kept.size() == out.sel.layers[0][0].kept.size();
            out.n_cells = std::max(out.n_cells, int32_t(h.kept.size()));
        }
    }
    cparams.n_ctx     = uint32_t(out.n_cells + n_extra);
    cparams.n_seq_max = 1;
    cparams.cb_eval   = nullptr;
    if (observer != nullptr) {
        observer->attach(cparams);
    }
    out.ctx.reset(llama_init_from_model(const_cast<llama_model *>(model), cparams));
    if (!out.ctx) {
        throw error("cannot create the decode context (" + std::to_string(cparams.n_ctx) + " cells)");
    }
    if (llama_state_seq_set_data(out.ctx.get(), out.state.data(), out.state.size(), 0) != out.state.size()) {
        throw error("llama.cpp rejected the compacted sequence state");
    }
    if (!uniform) {  // heads keeping fewer tokens than n_cells hide their padding cells
        out.bias = padding_bias(out.sel, llama_model_n_head(model), out.n_cells);
        if (!llama_set_kv_head_bias(out.ctx.get(), out.bias.data(), uint32_t(out.n_cells))) {
            throw error("the model's KV cache does not take a per-head bias (SWA or hybrid memory)");
        }
    }
    out.rebuild_seconds = seconds_since(t0);
    out.kv_bytes_alloc  = kv_bytes_allocated(out.ctx.get(), state.kv_bytes_per_cell());
    out.kv_bytes_kept   = out.sel.kv_bytes_kept;
    return out;
}

}  // namespace ecokv::llama
