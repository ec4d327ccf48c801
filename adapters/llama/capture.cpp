// Query capture through llama.cpp's eval callback (notes: llamacpp-0.5.0.md §3.2).
#include "ecokv/error.h"
#include "ecokv/llama-adapter.h"

#include <ggml-backend.h>
#include <ggml.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace ecokv::llama {

struct query_capture::impl {
    int32_t n_layers = 0, n_heads = 0, head_dim = 0;
    int32_t n_queries = 32;
    bool    full      = false;
    bool    active    = true;
    // Per layer: rows [token][head][head_dim]; the window keeps the last n_queries tokens.
    std::vector<std::vector<float>> window, all;
    std::vector<int32_t>            seen;  // tokens recorded per layer
    int32_t                         expected = -1;  // tokens recorded when recording ends, or -1: unknown
    uint64_t                        bytes_to_host = 0;
    std::string                     failure;  // an exception must not cross ggml's C callback
    bool                            probe = false;
    std::vector<std::vector<float>> outputs;  // [n_layers] attention output (kqv_out) of the last token decoded

    static bool callback(ggml_tensor * t, bool ask, void * user_data);
    void        record(const ggml_tensor * t, int32_t il);
    void        record_output(const ggml_tensor * t, int32_t il);
    tensor_view rows_view(const std::vector<float> & rows) const;
};

namespace {

// "<prefix>12" -> 12, else -1.
int32_t layer_of(const ggml_tensor * t, const char * prefix) {
    const size_t n = std::strlen(prefix);
    if (std::strncmp(t->name, prefix, n) != 0) {
        return -1;
    }
    char *     end = nullptr;
    const long il  = std::strtol(t->name + n, &end, 10);
    return end != t->name + n && *end == '\0' ? int32_t(il) : -1;
}

// The post-RoPE query node "Qcur-<il>".
int32_t query_layer(const ggml_tensor * t) { return t->op == GGML_OP_ROPE ? layer_of(t, "Qcur-") : -1; }

}  // namespace

bool query_capture::impl::callback(ggml_tensor * t, bool ask, void * user_data) {
    auto *        self = static_cast<impl *>(user_data);
    const int32_t il   = query_layer(t);
    const int32_t ol   = self->probe ? layer_of(t, "kqv_out-") : -1;
    if (ask) {
        return (self->active && il >= 0 && il < self->n_layers) || (ol >= 0 && ol < self->n_layers);
    }
    if (ol >= 0 && ol < self->n_layers) {
        try {
            self->record_output(t, ol);
        } catch (const std::exception & e) {
            self->failure = e.what();
            self->probe   = false;
        }
    }
    if (self->active && il >= 0 && il < self->n_layers) {
        try {
            self->record(t, il);
        } catch (const std::exception & e) {
            self->failure = e.what();
            self->active  = false;
        }
    }
    return true;  // never cancel the graph
}

void query_capture::impl::record(const ggml_tensor * t, int32_t il) {
    if (head_dim == 0) {  // head_dim is not always n_embd / n_head: take it from the graph
        head_dim = int32_t(t->ne[0]);
    }
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || t->ne[0] != head_dim || t->ne[1] != n_heads) {
        return;  // not the layout we know; leaves the capture short, which prefill_state reports
    }
    const int64_t n_tok = t->ne[2];
    const size_t  row   = size_t(n_heads) * head_dim;
    // Only rows that can end in the window are read (from a device, each row read is a transfer).
    const int64_t last  = expected >= 0 ? int64_t(expected) - seen[il] : n_tok;  // tokens to come, this batch's too
    const int64_t first = full ? 0 : std::clamp<int64_t>(last - n_queries, 0, n_tok);
    std::vector<float> buf(row * size_t(n_tok - first));
    ggml_backend_tensor_get(t, buf.data(), size_t(first) * row * sizeof(float), buf.size() * sizeof(float));
    if (t->buffer != nullptr && !ggml_backend_buffer_is_host(t->buffer)) {
        bytes_to_host += buf.size() * sizeof(float);
    }
    if (full) {
        all[il].insert(all[il].end(), buf.begin(), buf.end());
    }
    auto & w = window[il];
    w.insert(w.end(), buf.begin(), buf.end());
    if (w.size() > row * n_queries) {
        w.erase(w.begin(), w.end() - std::ptrdiff_t(row * n_queries));
    }
    seen[il] += int32_t(n_tok);
}

void query_capture::impl::record_output(const ggml_tensor * t, int32_t il) {
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) {
        return;
    }
    auto & out = outputs[il];
    out.resize(size_t(t->ne[0]));
    ggml_backend_tensor_get(t, out.data(), size_t(t->ne[1] - 1) * t->nb[1], out.size() * sizeof(float));
}

query_capture::query_capture(const llama_model * model, int32_t n_queries, bool full_queries) :
    impl_(std::make_unique<impl>()) {
    impl_->n_layers  = llama_model_n_layer(model);
    impl_->n_heads   = llama_model_n_head(model);
    impl_->n_queries = n_queries;
    impl_->full      = full_queries;
    impl_->window.resize(size_t(impl_->n_layers));
    impl_->all.resize(size_t(impl_->n_layers));
    impl_->seen.assign(size_t(impl_->n_layers), 0);
    impl_->outputs.resize(size_t(impl_->n_layers));
}

query_capture::~query_capture() = default;

void query_capture::attach(llama_context_params & params) {
    params.cb_eval           = &impl::callback;
    params.cb_eval_user_data = impl_.get();
}

void query_capture::set_active(bool active) { impl_->active = active; }

void query_capture::expect_tokens(int32_t n_total) { impl_->expected = n_total; }

int32_t query_capture::n_queries() const { return impl_->n_queries; }

void query_capture::forget_full_queries() {
    for (auto & rows : impl_->all) {
        rows.clear();
        rows.shrink_to_fit();  // a whole prompt's queries may have been there
    }
}
uint64_t query_capture::bytes_to_host() const { return impl_->bytes_to_host; }

void query_capture::set_probe(bool probe) { impl_->probe = probe; }

const std::vector<std::vector<float>> & query_capture::attention_outputs() const { return impl_->outputs; }

std::string query_capture::error() const { return impl_->failure; }

int32_t query_capture::n_tokens() const { return impl_->seen.empty() ? 0 : impl_->seen[0]; }

// [n_heads, n_rows, head_dim] view of rows stored [token][head][head_dim].
tensor_view query_capture::impl::rows_view(const std::vector<float> & rows) const {
    const size_t row = size_t(n_heads) * head_dim;
    tensor_view  v;
    v.data = rows.data();
    v.type = dtype::f32;
    v.ne   = { head_dim, int64_t(row ? rows.size() / row : 0), n_heads, 1 };
    v.nb   = { sizeof(float), row * sizeof(float), size_t(head_dim) * sizeof(float), 0 };
    return v;
}

tensor_view query_capture::queries(int32_t il) const { return impl_->rows_view(impl_->window.at(size_t(il))); }

tensor_view query_capture::full_queries(int32_t il) const {
    return impl_->full ? impl_->rows_view(impl_->all.at(size_t(il))) : tensor_view{};
}

}  // namespace ecokv::llama
