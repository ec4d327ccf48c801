#include "state-blob.h"

#include "ecokv/error.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace ecokv::llama {

namespace {

constexpr uint32_t k_magic = 0xaf143cd8u;  // io_magic, src/llama-context.cpp:3142

// ggml_type ids of the pinned ggml (ggml.h): GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1.
dtype cache_dtype(int32_t ggml_type) {
    if (ggml_type == 0) {
        return dtype::f32;
    }
    if (ggml_type == 1) {
        return dtype::f16;
    }
    throw error("KV cache type " + std::to_string(ggml_type) +
                " is not supported yet (use an F16 or F32 cache: --cache-type-k/--cache-type-v f16)");
}

class reader {
  public:
    explicit reader(const std::vector<uint8_t> & b) : b_(b) {}
    template <typename T> T get() {
        T v;
        need(sizeof(T));
        std::memcpy(&v, b_.data() + off_, sizeof(T));
        off_ += sizeof(T);
        return v;
    }
    void skip(size_t n) {
        need(n);
        off_ += n;
    }
    size_t offset() const { return off_; }
    bool   done() const { return off_ == b_.size(); }

  private:
    void need(size_t n) const {
        if (off_ + n > b_.size()) {
            throw error("sequence state ends early at byte " + std::to_string(off_) + " (llama.cpp format changed?)");
        }
    }
    const std::vector<uint8_t> & b_;
    size_t                       off_ = 0;
};

template <typename T> void put(std::vector<uint8_t> & out, const T & v) {
    const auto * p = reinterpret_cast<const uint8_t *>(&v);
    out.insert(out.end(), p, p + sizeof(T));
}

}  // namespace

std::vector<uint8_t> read_sequence(llama_context * ctx, llama_seq_id seq) {
    std::vector<uint8_t> bytes(llama_state_seq_get_size(ctx, seq));
    if (bytes.empty() || llama_state_seq_get_data(ctx, bytes.data(), bytes.size(), seq) != bytes.size()) {
        throw error("cannot read the sequence state");
    }
    return bytes;
}

bool uses_cell_ext(const llama_model * model) {
    const llama_rope_type t = llama_model_rope_type(model);
    return t == LLAMA_ROPE_TYPE_MROPE || t == LLAMA_ROPE_TYPE_IMROPE;
}

uint32_t state_blob::cell_count(const std::vector<uint8_t> & bytes) {
    uint32_t n = 0;  // after u32 magic, i32 seq_id, u32 n_stream
    if (bytes.size() >= 16) {
        std::memcpy(&n, bytes.data() + 12, sizeof n);
    }
    return n;
}

state_blob::state_blob(llama_context * ctx) :
    state_blob(read_sequence(ctx), uses_cell_ext(llama_get_model(ctx)), llama_model_n_head_kv(llama_get_model(ctx))) {}

uint64_t state_blob::bytes_per_cell() const {
    return uint64_t(n_layers()) * n_kv_heads_ *
           (uint64_t(head_dim_k_) * dtype_size(k_type_) + uint64_t(head_dim_v_) * dtype_size(v_type_));
}

state_blob::state_blob(std::vector<uint8_t> bytes, bool has_ext, int32_t n_kv_heads) :
    bytes_(std::move(bytes)),
    has_ext_(has_ext),
    n_kv_heads_(n_kv_heads) {
    reader r(bytes_);
    if (r.get<uint32_t>() != k_magic) {
        throw error("sequence state has an unknown magic (not llama.cpp 0.5.0?)");
    }
    r.get<int32_t>();  // seq_id
    if (r.get<uint32_t>() != 1) {
        throw error("sequence state with several streams is not supported (use one sequence, kv_unified off)");
    }
    n_cells_ = int32_t(r.get<uint32_t>());
    if (n_cells_ == 0) {
        throw error("the sequence state holds no cells (nothing was decoded)");
    }
    for (int32_t i = 0; i < n_cells_; ++i) {
        cell_meta m;
        m.pos               = r.get<int32_t>();
        const uint32_t n_seq = r.get<uint32_t>();
        if (has_ext_) {
            for (int32_t & e : m.ext) {
                e = r.get<int32_t>();
            }
        }
        r.skip(size_t(n_seq) * sizeof(int32_t));
        cells_.push_back(m);
    }
    v_trans_               = r.get<uint32_t>() != 0;
    const uint32_t n_layer = r.get<uint32_t>();
    for (uint32_t il = 0; il < n_layer; ++il) {
        const dtype    t   = cache_dtype(r.get<int32_t>());
        const uint64_t row = r.get<uint64_t>();
        if (il > 0 && (t != k_type_ || row != k_row_)) {
            throw error("layers with different K cache rows are not supported (SWA/hybrid models)");
        }
        k_type_ = t;
        k_row_  = row;
        k_off_.push_back(r.offset());
        r.skip(size_t(row) * n_cells_);
    }
    for (uint32_t il = 0; il < n_layer; ++il) {
        v_type_ = cache_dtype(r.get<int32_t>());
        if (!v_trans_) {
            v_row_ = r.get<uint64_t>();
            v_off_.push_back(r.offset());
            r.skip(size_t(v_row_) * n_cells_);
        } else {
            v_row_               = r.get<uint32_t>();  // bytes per element
            const uint32_t n_emb = r.get<uint32_t>();
            v_off_.push_back(r.offset());
            r.skip(size_t(n_emb) * v_row_ * n_cells_);
            // Transpose once so every (head, token) row is contiguous, as the core's views require.
            std::vector<uint8_t> t(size_t(n_emb) * v_row_ * n_cells_);
            for (uint32_t j = 0; j < n_emb; ++j) {
                for (int32_t c = 0; c < n_cells_; ++c) {
                    std::memcpy(t.data() + (size_t(c) * n_emb + j) * v_row_,
                                bytes_.data() + v_off_.back() + (size_t(j) * n_cells_ + c) * v_row_, v_row_);
                }
            }
            v_transposed_.push_back(std::move(t));
        }
    }
    if (!r.done()) {
        throw error("sequence state has " + std::to_string(bytes_.size() - r.offset()) +
                    " unparsed bytes (cell ext mismatch or llama.cpp format changed)");
    }
    const size_t v_row_bytes = v_trans_ ? v_transposed_[0].size() / n_cells_ : v_row_;
    head_dim_k_              = int32_t(k_row_ / dtype_size(k_type_) / n_kv_heads_);
    head_dim_v_              = int32_t(v_row_bytes / dtype_size(v_type_) / n_kv_heads_);
}

int32_t state_blob::pos_max() const {
    int32_t m = 0;
    for (const cell_meta & c : cells_) {
        m = std::max(m, c.pos);
    }
    return m;
}

void state_blob::keep_first(int32_t n) {
    if (n < 1 || n > n_cells_) {
        throw error("the sequence state holds " + std::to_string(n_cells_) + " cells, not the " + std::to_string(n) +
                    " of its prompt");
    }
    n_cells_ = n;  // rows keep their strides: the first n cells are the first n rows of every layer
    cells_.resize(size_t(n));
}

tensor_view state_blob::keys(int32_t il) const {
    tensor_view v;
    v.data = bytes_.data() + k_off_[il];
    v.type = k_type_;
    v.ne   = { head_dim_k_, n_cells_, n_kv_heads_, 1 };
    v.nb   = { dtype_size(k_type_), k_row_, size_t(head_dim_k_) * dtype_size(k_type_), 0 };
    return v;
}

tensor_view state_blob::values(int32_t il) const {
    const size_t row = size_t(head_dim_v_) * n_kv_heads_ * dtype_size(v_type_);
    tensor_view  v;
    v.data = v_trans_ ? v_transposed_[il].data() : bytes_.data() + v_off_[il];
    v.type = v_type_;
    v.ne   = { head_dim_v_, n_cells_, n_kv_heads_, 1 };
    v.nb   = { dtype_size(v_type_), row, size_t(head_dim_v_) * dtype_size(v_type_), 0 };
    return v;
}

std::vector<uint8_t> state_blob::compacted(const std::vector<std::vector<std::vector<int32_t>>> & kept,
                                           int32_t seq_id) const {
    int32_t n = 0;
    for (const auto & layer : kept) {
        for (const auto & head : layer) {
            n = std::max(n, int32_t(head.size()));
        }
    }
    // Token of cell i in (il, ig), or -1 for padding.
    auto token = [&](int32_t il, int32_t ig, int32_t i) { return i < int32_t(kept[il][ig].size()) ? kept[il][ig][i] : -1; };
    std::vector<uint8_t> out;
    put(out, k_magic);
    put(out, seq_id);
    put(out, uint32_t(1));
    put(out, uint32_t(n));
    const int32_t top = pos_max();
    for (int32_t i = 0; i < n; ++i) {
        const int32_t pos = std::max(0, top - n + 1 + i);
        put(out, pos);
        put(out, uint32_t(1));
        if (has_ext_) {
            put(out, pos);       // x
            put(out, pos);       // y
            put(out, int32_t(-1));  // tok: LLAMA_TOKEN_NULL
        }
        put(out, seq_id);
    }
    put(out, uint32_t(v_trans_ ? 1 : 0));
    put(out, uint32_t(n_layers()));
    const size_t k_head = size_t(head_dim_k_) * dtype_size(k_type_);
    for (int32_t il = 0; il < n_layers(); ++il) {
        put(out, int32_t(k_type_ == dtype::f32 ? 0 : 1));
        put(out, uint64_t(k_row_));
        const size_t base = out.size();
        out.resize(base + k_row_ * n);
        for (int32_t i = 0; i < n; ++i) {
            for (int32_t g = 0; g < n_kv_heads_; ++g) {
                if (const int32_t t = token(il, g, i); t >= 0) {
                    std::memcpy(out.data() + base + i * k_row_ + g * k_head,
                                bytes_.data() + k_off_[il] + size_t(t) * k_row_ + g * k_head, k_head);
                }
            }
        }
    }
    const size_t v_el   = dtype_size(v_type_);
    const size_t v_head = size_t(head_dim_v_) * v_el;
    for (int32_t il = 0; il < n_layers(); ++il) {
        put(out, int32_t(v_type_ == dtype::f32 ? 0 : 1));
        const tensor_view src = values(il);
        if (!v_trans_) {
            put(out, uint64_t(v_row_));
            const size_t base = out.size();
            out.resize(base + v_row_ * n);
            for (int32_t i = 0; i < n; ++i) {
                for (int32_t g = 0; g < n_kv_heads_; ++g) {
                    if (const int32_t t = token(il, g, i); t >= 0) {
                        std::memcpy(out.data() + base + i * v_row_ + g * v_head, src.row(t, g), v_head);
                    }
                }
            }
        } else {
            const uint32_t n_emb = uint32_t(head_dim_v_ * n_kv_heads_);
            put(out, uint32_t(v_el));
            put(out, n_emb);
            const size_t base = out.size();
            out.resize(base + size_t(n_emb) * n * v_el);
            for (int32_t g = 0; g < n_kv_heads_; ++g) {
                for (int32_t x = 0; x < head_dim_v_; ++x) {
                    const size_t j = size_t(g) * head_dim_v_ + x;
                    for (int32_t i = 0; i < n; ++i) {
                        if (const int32_t t = token(il, g, i); t >= 0) {
                            std::memcpy(out.data() + base + (j * n + i) * v_el,
                                        static_cast<const uint8_t *>(src.row(t, g)) + x * v_el, v_el);
                        }
                    }
                }
            }
        }
    }
    return out;
}

}  // namespace ecokv::llama
