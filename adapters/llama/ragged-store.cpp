// The ragged cache a compression builds (make_ragged, llama_kv_set_ragged's callback): the kept rows of each (layer,
// KV head) written into the new stores, by a graph of get_rows on their device where the rows can stay there
// (gathers_on_backend), through the host otherwise. Kept apart from kv-store.cpp, which only reads the stores: this
// is the one code that writes them.
#include "kv-store.h"

#include "ecokv/error.h"

#include <ggml-backend.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>

namespace ecokv::llama {

namespace {

bool is_host(const ggml_tensor * t) { return t->buffer == nullptr || ggml_backend_buffer_is_host(t->buffer); }

// ECOKV_GATHER_ON_BACKEND: 1 always (host stores too, on the CPU backend), 0 never (through the host), else where
// the stores are in device memory.
int backend_gather_setting() {
    static const int setting = [] {
        const char * e = std::getenv("ECOKV_GATHER_ON_BACKEND");
        return e == nullptr ? -1 : std::strcmp(e, "1") == 0 ? 1 : std::strcmp(e, "0") == 0 ? 0 : -1;
    }();
    return setting;
}

// Kept rows of slice g, in the store's type: the method's rewritten rows (F32) where it has them.
std::vector<uint8_t> gather(const tensor_view & src, int64_t g, const std::vector<int32_t> & kept,
                            const std::vector<float> & rewritten, ggml_type type, int64_t n_dim) {
    const size_t         dim = size_t(n_dim);
    const size_t         row = ggml_row_size(type, int64_t(dim));
    std::vector<uint8_t> out(row * kept.size());
    for (size_t i = 0; i < kept.size(); ++i) {
        uint8_t * dst = out.data() + i * row;
        if (rewritten.empty()) {
            std::memcpy(dst, src.row(kept[i], g), row);  // whole blocks of an encoded row, as stored
        } else {
            ggml_quantize_chunk(type, rewritten.data() + i * dim, dst, 0, 1, int64_t(dim), nullptr);
        }
    }
    return out;
}

struct backend_deleter {
    void operator()(ggml_backend_t b) const { ggml_backend_free(b); }
    void operator()(ggml_context * c) const { ggml_free(c); }
    void operator()(ggml_backend_buffer_t b) const { ggml_backend_buffer_free(b); }
};

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

struct fill_job {
    const capture_view &         src;
    const selection &            sel;
    uint32_t                     n_cells;  // cells per head of the ragged cache: 1 + n_room
    const candidate_rows &       from;
    std::vector<ggml_tensor *>   old_k, old_v;  // per layer, the stores the kept rows come from
    std::vector<int32_t>         index;         // per model layer, its layer in the selection (-1: not compressed)
    std::vector<uint32_t>        align, from_align;  // per layer, llama_kv_ragged_row_align of the new and old stores
    int32_t                      n_prompt = 0;  // cells of a transposed V store to read
    bool                         v_transposed = false;
    std::map<ggml_backend_dev_t, std::unique_ptr<ggml_backend, backend_deleter>> backends;
    std::string                  failure;

    ggml_backend_t backend_of(const ggml_tensor * t) {
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(t->buffer));
        if (dev == nullptr) {  // a host buffer type of no device: the CPU's
            dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        }
        auto &             b   = backends[dev];
        if (!b) {
            b.reset(ggml_backend_dev_init(dev, nullptr));
            if (!b) {
                throw error("cannot start the backend of device " + std::string(ggml_backend_dev_name(dev)));
            }
        }
        return b.get();
    }
};

// A [ne0, ne1] tensor of `type` over the bytes at `addr` of `buffer`: rows of a KV store seen as I32 words, so that
// get_rows copies them bit for bit whatever the store's type.
ggml_tensor * alias(ggml_context * ctx, ggml_backend_buffer_t buffer, void * addr, ggml_type type, int64_t ne0,
                    int64_t ne1) {
    ggml_tensor * t = ggml_new_tensor_2d(ctx, type, ne0, ne1);
    if (ggml_backend_tensor_alloc(buffer, t, addr) != GGML_STATUS_SUCCESS) {
        throw error("cannot view a KV store");
    }
    return t;
}

// Computes gf on the backend, every view in it placed first (no allocator runs: the tensors have their memory).
void compute(ggml_backend_t be, ggml_cgraph * gf, const char * what) {
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        ggml_tensor * t = ggml_graph_node(gf, i);
        if (t->view_src != nullptr && t->buffer == nullptr) {
            ggml_backend_view_init(t);
        }
    }
    if (ggml_graph_n_nodes(gf) > 0 && ggml_backend_graph_compute(be, gf) != GGML_STATUS_SUCCESS) {
        throw error(std::string(what) + " on the device failed");
    }
}

// The kept rows of layer il's store `old` (K, or V when is_v) written into `store` on their backend, without the host:
// one get_rows per KV head over the old rows seen as I32 words, its output placed in the head's rows of the new
// store. A transposed V (a context without flash attention) is first copied to rows (its prompt cells only) in a
// buffer of the backend. Heads whose rows a merge rewrote are written from the host. Throws ecokv::error.
void gather_with_graph(fill_job & job, int32_t il, const ggml_tensor * old, ggml_tensor * store, bool is_v) {
    const auto &   layer  = job.sel.layers[il];
    const int32_t  n_kv   = int32_t(layer.size());
    const bool     trans  = is_v && job.v_transposed;
    const size_t   row    = ggml_row_size(store->type, store->ne[0]);  // one head's entry, whole words
    const int64_t  words  = int64_t(row / sizeof(int32_t));
    ggml_backend_t be     = job.backend_of(store);
    const size_t   n_tens = size_t(4 * n_kv + 8);
    std::unique_ptr<ggml_context, backend_deleter> ctx(
        ggml_init({ n_tens * ggml_tensor_overhead() + ggml_graph_overhead_custom(n_tens, false), nullptr, true }));

    // The tensors needing memory of the backend: the transposed V's rows, each head's indices.
    ggml_tensor * cells = trans ? ggml_new_tensor_2d(ctx.get(), old->type, old->ne[0], job.n_prompt) : nullptr;
    std::vector<ggml_tensor *> index(size_t(n_kv), nullptr);
    for (int32_t g = 0; g < n_kv; ++g) {
        if (!layer[g].kept.empty() && (is_v ? layer[g].values : layer[g].keys).empty()) {
            index[g] = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I32, int64_t(layer[g].kept.size()));
        }
    }
    std::unique_ptr<ggml_backend_buffer, backend_deleter> scratch(ggml_backend_alloc_ctx_tensors(ctx.get(), be));
    ggml_cgraph * gf = ggml_new_graph_custom(ctx.get(), n_tens, false);
    if (trans) {  // old: element e of cell c at e * n_cells_total + c
        ggml_tensor * t = ggml_view_2d(ctx.get(), const_cast<ggml_tensor *>(old), job.n_prompt, old->ne[0],
                                       size_t(old->ne[1]) * ggml_type_size(old->type), 0);
        ggml_build_forward_expand(gf, ggml_cpy(ctx.get(), ggml_transpose(ctx.get(), t), cells));
        compute(be, gf, "transposing a V store");
        ggml_graph_clear(gf);
    }
    const ggml_tensor * src  = trans ? cells : old;  // [words, rows of one head] below
    ggml_tensor *       rows = alias(ctx.get(), src->buffer, src->data, GGML_TYPE_I32, words,
                                     int64_t(ggml_nbytes(src) / row));
    size_t row0 = 0;
    for (int32_t g = 0; g < n_kv; ++g) {
        const head_selection & h = layer[g];
        row0 = round_up(row0, job.align[size_t(il)]);
        if (index[g] != nullptr) {
            std::vector<int32_t> at(h.kept.size());
            for (size_t j = 0; j < at.size(); ++j) {
                at[j] = int32_t(job.from.row(il, g, h.kept[j], job.from_align[size_t(il)]));
            }
            ggml_backend_tensor_set(index[g], at.data(), 0, at.size() * sizeof(int32_t));
            ggml_tensor * out = ggml_get_rows(ctx.get(), rows, index[g]);
            if (ggml_backend_tensor_alloc(store->buffer, out, static_cast<char *>(store->data) + row0 * row) !=
                GGML_STATUS_SUCCESS) {
                throw error("cannot place the kept rows of a KV head");
            }
            ggml_build_forward_expand(gf, out);
        } else if (!h.kept.empty()) {
            const auto rewritten = gather({}, 0, h.kept, is_v ? h.values : h.keys, store->type, store->ne[0]);
            ggml_backend_tensor_set(store, rewritten.data(), row0 * row, rewritten.size());
        }
        row0 += h.kept.size() + job.n_cells;
    }
    compute(be, gf, "gathering the kept rows");
}

// Layer il's kept rows from the capture's (host) views into `store`.
void gather_on_host(const fill_job & job, int32_t il, ggml_tensor * store, bool is_v) {
    size_t row0 = 0;
    for (size_t g = 0; g < job.sel.layers[il].size(); ++g) {
        const head_selection & h    = job.sel.layers[il][g];
        row0 = round_up(row0, job.align[size_t(il)]);
        const head_view        src  = job.src.head(il, int32_t(g));
        const auto             rows = is_v ? gather(src.values, src.slice, h.kept, h.values, store->type, store->ne[0])
                                           : gather(src.keys, src.slice, h.kept, h.keys, store->type, store->ne[0]);
        ggml_backend_tensor_set(store, rows.data(), row0 * store->nb[1], rows.size());
        row0 += h.kept.size() + job.n_cells;
    }
}

bool fill_layer(int32_t model_layer, ggml_tensor * k, ggml_tensor * v, void * user_data) {
    auto & job = *static_cast<fill_job *>(user_data);
    try {
        const int32_t il = job.index.at(size_t(model_layer));
        if (il < 0) {
            throw error("llama.cpp asked for layer " + std::to_string(model_layer) + ", which is not compressed");
        }
        const int32_t n_kv = job.src.n_kv_heads;
        for (const bool is_v : { false, true }) {
            const ggml_tensor * old   = (is_v ? job.old_v : job.old_k)[il];
            ggml_tensor *       store = is_v ? v : k;
            if (gathers_on_backend(old, job.from.layout.empty() ? n_kv : 1) &&
                ggml_backend_buffer_get_type(old->buffer) == ggml_backend_buffer_get_type(store->buffer)) {
                gather_with_graph(job, il, old, store, is_v);
            } else {
                gather_on_host(job, il, store, is_v);
            }
        }
        return true;
    } catch (const std::exception & e) {
        job.failure = e.what();
        return false;
    }
}

}  // namespace

bool gathers_on_backend(const ggml_tensor * store, int32_t n_kv_heads) {
    const int setting = backend_gather_setting();
    return setting != 0 && (setting == 1 || !is_host(store)) && store->buffer != nullptr &&
           ggml_row_size(store->type, store->ne[0] / n_kv_heads) % sizeof(int32_t) == 0;
}

int64_t candidate_rows::row(int32_t il, int32_t h, int32_t i, uint32_t align) const {
    if (layout.empty()) {
        return int64_t(i) * n_kv_heads + h;
    }
    int64_t row0 = 0;
    for (int32_t g = 0; g < h; ++g) {
        row0 += int64_t(layout[size_t(il) * n_kv_heads + g]) + 1 + n_room;
        row0 = (row0 + align - 1) / align * align;
    }
    return row0 + i + (uint32_t(i) < layout[size_t(il) * n_kv_heads + h] ? 0 : 1);  // past the label row
}

std::vector<uint32_t> ragged_layout(const selection & sel) {
    std::vector<uint32_t> n_keep;
    for (const auto & layer : sel.layers) {
        for (const head_selection & h : layer) {
            n_keep.push_back(uint32_t(h.kept.size()));
        }
    }
    return n_keep;
}

void make_ragged(llama_context * ctx, const capture_view & src, const selection & sel, int32_t n_room, llama_pos pos,
                 const candidate_rows & from) {
    if (int32_t(sel.layers.size()) != src.n_layers) {
        throw error("the selection has " + std::to_string(sel.layers.size()) + " layers, the capture " +
                    std::to_string(src.n_layers));
    }
    const std::vector<int32_t> layers = compressed_layers(ctx);
    if (layers != compressed_layers(from.ctx) || int32_t(layers.size()) != src.n_layers) {
        throw error("the capture's layers are not those this context compresses");
    }
    const int32_t         n_kv = src.n_kv_heads;
    std::vector<uint32_t> n_keep(size_t(llama_model_n_layer(llama_get_model(ctx))) * n_kv, 0);  // by model layer
    fill_job              job{ src, sel, uint32_t(1 + n_room), from, {}, {}, {}, {}, {}, src.n_tokens, false, {}, {} };
    job.index.assign(n_keep.size() / n_kv, -1);
    for (int32_t i = 0; i < src.n_layers; ++i) {
        job.index[size_t(layers[i])] = i;
        job.old_k.push_back(layer_store(from.ctx, layers[i], false));
        job.old_v.push_back(layer_store(from.ctx, layers[i], true));
        job.align.push_back(llama_kv_ragged_row_align(ctx, layers[i]));
        job.from_align.push_back(llama_kv_ragged_row_align(from.ctx, layers[i]));
        for (int32_t g = 0; g < n_kv; ++g) {
            n_keep[size_t(layers[i]) * n_kv + g] = uint32_t(sel.layers[i][g].kept.size());
        }
    }
    job.v_transposed = llama_kv_layout(from.ctx) == 1;
    if (!llama_kv_set_ragged(ctx, n_keep.data(), uint32_t(n_room), pos, fill_layer, &job)) {
        throw error(job.failure.empty() ? "llama.cpp cannot make this cache ragged (a plain single-sequence KV cache "
                                        "with K and V in every layer is needed, and memory for the kept entries)"
                                      : "writing the kept entries failed: " + job.failure);
    }
}

}  // namespace ecokv::llama
