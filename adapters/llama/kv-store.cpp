// The KV stores of a llama.cpp context read in place (kv-store.h): their row formats, views of the usual layout and
// of a ragged cache's candidates, sizes, the sequence and sliding-window states, and the cache types a session may
// use. Writing a ragged cache is ragged-store.cpp's.
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

}  // namespace

ggml_tensor * layer_store(const llama_context * ctx, int32_t il, bool v) {
    ggml_tensor * t = llama_kv_store(ctx, il, v);
    if (t == nullptr) {
        throw error("the model's memory is not a plain KV cache with K and V in every layer (SWA, hybrid or MLA)");
    }
    return t;
}

void check_cache_types(const llama_model * model, const session_options & o) {
    for (const bool is_v : { false, true }) {
        const ggml_type   t    = is_v ? o.type_v : o.type_k;
        const std::string flag = engine_option_name(is_v ? "cache_type_v" : "cache_type_k") + " ";
        const row_format  f    = cache_format(t);
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
            n = std::max(n, layer_store(ctx, il, false)->ne[1]);  // K: [n_embd_k_gqa, cells]
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
        n += ggml_nbytes(layer_store(ctx, il, false)) + ggml_nbytes(layer_store(ctx, il, true));
    }
    return n;
}

uint64_t kv_bytes_per_cell(const llama_context * ctx) {
    // a ragged store's row is one head's; the usual one's (a sliding-window layer's always) holds every head
    const bool ragged = llama_kv_layout(ctx) == 2;
    uint64_t   n      = 0;
    for (int32_t il = 0; il < llama_model_n_layer(llama_get_model(ctx)); ++il) {
        const ggml_tensor * k     = layer_store(ctx, il, false);
        const ggml_tensor * v     = layer_store(ctx, il, true);
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
        const ggml_tensor * k       = layer_store(ctx, il, false);
        const ggml_tensor * v       = layer_store(ctx, il, true);
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
            const ggml_tensor * t = layer_store(ctx, il, is_v);
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
            ggml_tensor * t   = const_cast<ggml_tensor *>(layer_store(ctx, layers[il], is_v));
            const size_t  row = t->nb[1];  // one head's entry
            (is_v ? v_row_ : k_row_).push_back(row);
            (is_v ? v_type_ : k_type_).push_back(t->type);
            (is_v ? v_dim_ : k_dim_).push_back(int32_t(t->ne[0]));
            const bool copied = !is_v || values || !gathers_on_backend(t, 1);
            if (is_v) {
                v_copied_.push_back(copied);
            }
            size_t       row0  = 0;  // head g owns rows [row0, row0 + n_keep + 1 + n_room), row0 aligned
            const size_t align = llama_kv_ragged_row_align(ctx, layers[il]);
            for (int32_t g = 0; g < n_kv_; ++g) {
                const size_t keep = n_keep[size_t(il) * n_kv_ + g];
                row0 = (row0 + align - 1) / align * align;
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

}  // namespace ecokv::llama
