#include "kv-store.h"

#include "ecokv/error.h"
#include "ecokv/llama-options.h"

#include <ggml-backend.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

namespace ecokv::llama {

namespace {

// How rows of a ggml type are viewed: F32 and F16 as themselves, every other type the ragged store takes
// (bf16 and the quantized types llama.cpp offers for KV caches) as encoded rows that ggml's type traits decode.
struct row_format {
    dtype             type  = dtype::f32;
    const row_codec * codec = nullptr;

    size_t row_bytes(int64_t n) const { return codec ? codec->row_bytes(n) : size_t(n) * dtype_size(type); }
};

const row_codec * codec_of(ggml_type t) {
    static const std::map<ggml_type, row_codec> codecs = [] {
        std::map<ggml_type, row_codec> m;
        for (const ggml_type q : cache_types()) {
            if (q != GGML_TYPE_F32 && q != GGML_TYPE_F16) {
                const ggml_type_traits * tr = ggml_get_type_traits(q);
                m[q] = { tr->type_name, tr->blck_size, tr->type_size, tr->to_float };
            }
        }
        return m;
    }();
    const auto it = codecs.find(t);
    return it == codecs.end() ? nullptr : &it->second;
}

row_format cache_format(ggml_type t) {
    if (t == GGML_TYPE_F32 || t == GGML_TYPE_F16) {
        return { t == GGML_TYPE_F32 ? dtype::f32 : dtype::f16, nullptr };
    }
    if (const row_codec * c = codec_of(t)) {
        return { dtype::encoded, c };
    }
    throw error(std::string("KV cache type ") + ggml_type_name(t) + " is not one ecokv can compress");
}

ggml_tensor * store(const llama_context * ctx, int32_t il, bool v) {
    ggml_tensor * t = llama_kv_store(ctx, il, v);
    if (t == nullptr) {
        throw error("the model's memory is not a plain KV cache with K and V in every layer (SWA, hybrid or MLA)");
    }
    return t;
}

// A [n_kv_heads, n_cells, head_dim] view of rows of n_kv_heads * head_dim elements, one per cell, at `data`.
tensor_view cell_rows(const void * data, row_format f, int32_t n_kv, int32_t n_cells, int32_t head_dim, size_t row) {
    tensor_view v;
    v.data  = data;
    v.type  = f.type;
    v.codec = f.codec;
    v.ne    = { head_dim, n_cells, n_kv, 1 };
    v.nb    = { f.codec ? 0 : dtype_size(f.type), row, f.row_bytes(head_dim), 0 };
    return v;
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

struct fill_job {
    const capture_view &         src;
    const selection &            sel;
    uint32_t                     n_cells;  // cells per head of the ragged cache: 1 + n_room
    const candidate_rows &       from;
    std::vector<ggml_tensor *>   old_k, old_v;  // per layer, the stores the kept rows come from
    std::vector<int32_t>         index;         // per model layer, its layer in the selection (-1: not compressed)
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
        if (index[g] != nullptr) {
            std::vector<int32_t> at(h.kept.size());
            for (size_t j = 0; j < at.size(); ++j) {
                at[j] = int32_t(job.from.row(il, g, h.kept[j]));
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

// Elements per K (or V) head: GGUF's <arch>.attention.key_length (value_length), n_embd / n_head without it.
int32_t head_dim(const llama_model * model, bool v) {
    char arch[64] = {}, dim[32] = {};
    if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch) > 0 &&
        llama_model_meta_val_str(model, (std::string(arch) + (v ? ".attention.value_length" : ".attention.key_length")).c_str(),
                                 dim, sizeof dim) > 0) {
        return int32_t(std::strtol(dim, nullptr, 10));
    }
    return llama_model_n_embd(model) / llama_model_n_head(model);
}

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

}  // namespace

bool gathers_on_backend(const ggml_tensor * store, int32_t n_kv_heads) {
    const int setting = backend_gather_setting();
    return setting != 0 && (setting == 1 || !is_host(store)) && store->buffer != nullptr &&
           ggml_row_size(store->type, store->ne[0] / n_kv_heads) % sizeof(int32_t) == 0;
}

int64_t candidate_rows::row(int32_t il, int32_t h, int32_t i) const {
    if (layout.empty()) {
        return int64_t(i) * n_kv_heads + h;
    }
    int64_t row0 = 0;
    for (int32_t g = 0; g < h; ++g) {
        row0 += int64_t(layout[size_t(il) * n_kv_heads + g]) + 1 + n_room;
    }
    return row0 + i + (uint32_t(i) < layout[size_t(il) * n_kv_heads + h] ? 0 : 1);  // past the label row
}

void check_cache_types(const llama_model * model, const session_options & o) {
    for (const bool is_v : { false, true }) {
        const ggml_type  t    = is_v ? o.type_v : o.type_k;
        const char *     flag = is_v ? "--cache-type-v " : "--cache-type-k ";
        const row_format f    = cache_format(t);
        if (is_v && ggml_is_quantized(t) && o.flash_attn == LLAMA_FLASH_ATTN_TYPE_DISABLED) {
            throw error(flag + std::string(ggml_type_name(t)) +
                        ": a quantized V cache needs flash attention (-fa on or auto), as in llama.cpp");
        }
        const int32_t n_embd = head_dim(model, is_v);
        if (f.codec && n_embd % f.codec->block_size != 0) {
            throw error(flag + std::string(ggml_type_name(t)) + " stores blocks of " +
                        std::to_string(f.codec->block_size) + " elements; this model's " + (is_v ? "V" : "K") +
                        " heads have " + std::to_string(n_embd) + " (use f16, f32 or bf16)");
        }
    }
}

std::vector<uint8_t> read_sequence(llama_context * ctx, llama_seq_id seq) {
    std::vector<uint8_t> bytes(llama_state_seq_get_size(ctx, seq));
    if (bytes.empty() || llama_state_seq_get_data(ctx, bytes.data(), bytes.size(), seq) != bytes.size()) {
        throw error("cannot read the sequence state");
    }
    return bytes;
}

uint32_t state_cell_count(const std::vector<uint8_t> & bytes) {
    uint32_t n = 0;  // after u32 magic, i32 seq_id, u32 n_stream (src/llama-context.cpp, src/llama-kv-cache.cpp)
    if (bytes.size() >= 16) {
        std::memcpy(&n, bytes.data() + 12, sizeof n);
    }
    return n;
}

std::vector<int32_t> compressed_layers(const llama_context * ctx) {
    std::vector<int32_t> layers;
    for (int32_t il = 0; il < llama_model_n_layer(llama_get_model(ctx)); ++il) {
        if (!llama_kv_layer_sliding(ctx, il)) {
            layers.push_back(il);
        }
    }
    return layers;
}

int32_t window_cells(const llama_model * model) { return llama_model_n_swa(model); }

int32_t store_cells(const llama_context * ctx, bool sliding_only) {
    const bool ragged = llama_kv_layout(ctx) == 2;
    int64_t    n      = 0;
    for (int32_t il = 0; il < llama_model_n_layer(llama_get_model(ctx)); ++il) {
        const bool sliding = llama_kv_layer_sliding(ctx, il);
        if (sliding || (!sliding_only && !ragged)) {
            n = std::max(n, store(ctx, il, false)->ne[1]);  // K: [n_embd_k_gqa, cells]
        }
    }
    return int32_t(n);
}

std::vector<uint8_t> read_window(llama_context * ctx) {
    if (compressed_layers(ctx).size() == size_t(llama_model_n_layer(llama_get_model(ctx)))) {
        return {};  // no sliding-window layers
    }
    std::vector<uint8_t> window(llama_state_seq_get_size_ext(ctx, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY));
    if (llama_state_seq_get_data_ext(ctx, window.data(), window.size(), 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) !=
        window.size()) {
        throw error("cannot read the sliding-window cache");
    }
    return window;
}

void write_window(llama_context * ctx, const std::vector<uint8_t> & window) {
    if (!window.empty() && llama_state_seq_set_data_ext(ctx, window.data(), window.size(), 0,
                                                        LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) != window.size()) {
        throw error("cannot write the sliding-window cache");
    }
}

uint64_t kv_bytes_allocated(const llama_context * ctx) {
    uint64_t n = 0;
    for (int32_t il = 0; il < llama_model_n_layer(llama_get_model(ctx)); ++il) {
        n += ggml_nbytes(store(ctx, il, false)) + ggml_nbytes(store(ctx, il, true));
    }
    return n;
}

uint64_t kv_bytes_per_cell(const llama_context * ctx) {
    // a ragged store's row is one head's; the usual one's (a sliding-window layer's always) holds every head
    const bool ragged = llama_kv_layout(ctx) == 2;
    uint64_t   n      = 0;
    for (int32_t il = 0; il < llama_model_n_layer(llama_get_model(ctx)); ++il) {
        const ggml_tensor * k     = store(ctx, il, false);
        const ggml_tensor * v     = store(ctx, il, true);
        const uint64_t      heads = ragged && !llama_kv_layer_sliding(ctx, il) ? llama_model_n_head_kv(llama_get_model(ctx)) : 1;
        n += heads * (ggml_row_size(k->type, k->ne[0]) + ggml_row_size(v->type, v->ne[0]));
    }
    return n;
}

uint64_t kv_bytes_of_cells(const llama_context * ctx, int32_t n_cells) {
    const llama_model * model  = llama_get_model(ctx);
    const uint64_t      window = uint64_t(std::min(n_cells, std::max(llama_model_n_swa(model), 0)));
    const uint64_t      heads  = llama_kv_layout(ctx) == 2 ? uint64_t(llama_model_n_head_kv(model)) : 1;
    uint64_t            n      = 0;
    for (int32_t il = 0; il < llama_model_n_layer(model); ++il) {
        const ggml_tensor * k       = store(ctx, il, false);
        const ggml_tensor * v       = store(ctx, il, true);
        const bool          sliding = llama_kv_layer_sliding(ctx, il);
        const uint64_t      row     = (sliding ? 1 : heads) * (ggml_row_size(k->type, k->ne[0]) + ggml_row_size(v->type, v->ne[0]));
        n += row * (sliding ? window : uint64_t(n_cells));
    }
    return n;
}

cache_views::cache_views(const llama_context * ctx, int32_t n_cells, bool values) {
    const llama_model * model  = llama_get_model(ctx);
    const int32_t       n_kv   = llama_model_n_head_kv(model);
    const int32_t       layout = llama_kv_layout(ctx);
    if (layout == 2) {
        throw error("the sequence is compressed already (a ragged cache); compress its prefill instead");
    }
    for (const int32_t il : compressed_layers(ctx)) {
        for (const bool is_v : { false, true }) {
            const ggml_tensor * t = store(ctx, il, is_v);
            if (t->ne[0] % n_kv != 0 || n_cells > t->ne[1]) {
                throw error("unexpected KV store shape in layer " + std::to_string(il));
            }
            const row_format f   = cache_format(t->type);
            const size_t     row = t->nb[1];  // one cell: every head
            const void * data = t->data;
            const bool   host = t->buffer != nullptr && ggml_backend_buffer_is_host(t->buffer);
            if (is_v && !values && !host && gathers_on_backend(t, n_kv)) {
                data = nullptr;  // nobody reads them here: make_ragged gathers them on the device
            } else if (is_v && layout == 1) {  // [n_embd][n_cells_total]: gather each cell's row (F16 or F32 only)
                const size_t el   = dtype_size(f.type);
                auto &       copy = owned_.emplace_back(row * n_cells);
                std::vector<uint8_t> column(size_t(n_cells) * el);
                for (int64_t j = 0; j < t->ne[0]; ++j) {
                    ggml_backend_tensor_get(const_cast<ggml_tensor *>(t), column.data(), size_t(j) * t->ne[1] * el,
                                            size_t(n_cells) * el);
                    bytes_to_host_ += host ? 0 : uint64_t(n_cells) * el;
                    for (int32_t c = 0; c < n_cells; ++c) {
                        std::memcpy(copy.data() + c * row + j * el, column.data() + c * el, el);
                    }
                }
                data = copy.data();
            } else if (!host) {
                auto & copy = owned_.emplace_back(row * n_cells);
                ggml_backend_tensor_get(const_cast<ggml_tensor *>(t), copy.data(), 0, copy.size());
                bytes_to_host_ += copy.size();
                data = copy.data();
            }
            (is_v ? v_ : k_).push_back(cell_rows(data, f, n_kv, n_cells, int32_t(t->ne[0] / n_kv), row));
        }
    }
}

ragged_candidates::ragged_candidates(const llama_context * ctx, const std::vector<uint32_t> & n_keep, int32_t n_room,
                                     int32_t n_new, bool values) {
    const std::vector<int32_t> layers = compressed_layers(ctx);
    n_kv_                             = llama_model_n_head_kv(llama_get_model(ctx));
    if (llama_kv_layout(ctx) != 2 || n_keep.size() != layers.size() * n_kv_ || n_new < 0 || n_new > n_room) {
        throw error("the sequence holds no ragged cache of this layout with " + std::to_string(n_new) + " new tokens");
    }
    for (size_t il = 0; il < layers.size(); ++il) {
        for (const bool is_v : { false, true }) {
            ggml_tensor * t   = const_cast<ggml_tensor *>(store(ctx, layers[il], is_v));
            const size_t  row = t->nb[1];  // one head's entry
            (is_v ? v_row_ : k_row_).push_back(row);
            (is_v ? v_type_ : k_type_).push_back(t->type);
            (is_v ? v_dim_ : k_dim_).push_back(int32_t(t->ne[0]));
            const bool copied = !is_v || values || !gathers_on_backend(t, 1);
            if (is_v) {
                v_copied_.push_back(copied);
            }
            size_t row0 = 0;  // head g owns rows [row0, row0 + n_keep + 1 + n_room)
            for (int32_t g = 0; g < n_kv_; ++g) {
                const size_t keep = n_keep[size_t(il) * n_kv_ + g];
                auto &       out  = (is_v ? v_ : k_).emplace_back(copied ? (keep + size_t(n_new)) * row : 0);
                if (copied) {
                    ggml_backend_tensor_get(t, out.data(), row0 * row, keep * row);
                    ggml_backend_tensor_get(t, out.data() + keep * row, (row0 + keep + 1) * row, size_t(n_new) * row);
                    bytes_to_host_ += ggml_backend_buffer_is_host(t->buffer) ? 0 : out.size();
                }
                if (!is_v) {
                    rows_.push_back(int64_t(keep) + n_new);
                }
                row0 += keep + 1 + size_t(n_room);
            }
        }
    }
}

std::vector<head_tokens> ragged_candidates::heads() const {
    std::vector<head_tokens> out(rows_.size());
    for (size_t i = 0; i < rows_.size(); ++i) {
        const size_t il = i / size_t(n_kv_);
        for (const bool is_v : { false, true }) {
            const size_t row = (is_v ? v_row_ : k_row_)[il];
            const bool copied = !is_v || v_copied_[il];
            (is_v ? out[i].values : out[i].keys) =
                cell_rows(copied ? (is_v ? v_ : k_)[i].data() : nullptr, cache_format((is_v ? v_type_ : k_type_)[il]),
                          1, int32_t(rows_[i]), (is_v ? v_dim_ : k_dim_)[il], row);
        }
    }
    return out;
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
    fill_job              job{ src, sel, uint32_t(1 + n_room), from, {}, {}, {}, src.n_tokens, false, {}, {} };
    job.index.assign(n_keep.size() / n_kv, -1);
    for (int32_t i = 0; i < src.n_layers; ++i) {
        job.index[size_t(layers[i])] = i;
        job.old_k.push_back(store(from.ctx, layers[i], false));
        job.old_v.push_back(store(from.ctx, layers[i], true));
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
