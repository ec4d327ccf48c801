// ecokv-llama internals: the KV stores of a llama.cpp context (llama_kv_store, patches/llama.cpp), read in place
// (kv-store.cpp), and the ragged cache a compression builds from them (llama_kv_set_ragged; ragged-store.cpp).
#pragma once

#include "ecokv/llama-adapter.h"
#include "ecokv/llama-session.h"

#include <llama.h>

#include <cstdint>
#include <vector>

namespace ecokv::llama {

// Refuses, before any context is made, cache types a session cannot use with this model: a type ecokv does not
// compress, a quantized V without flash attention (llama.cpp's rule), rows that are not whole blocks of the type
// (head_dim a multiple of its block size). Throws ecokv::error naming the option.
void check_cache_types(const llama_model * model, const session_options & o);

// Model layer il's K store (v false) or V store, as llama.cpp holds it (llama_kv_store). Throws ecokv::error where the
// memory is not a plain KV cache with K and V in every layer (SWA, hybrid or MLA).
ggml_tensor * layer_store(const llama_context * ctx, int32_t il, bool v);

// The model layers a compression handles, in order: every layer of a plain KV cache; the global layers of an iSWA
// memory (Gemma 3), whose sliding-window layers keep llama.cpp's own cache, bounded by their window. A selection's
// layer i (and a capture's, a ragged layout's) is model layer compressed_layers(ctx)[i].
std::vector<int32_t> compressed_layers(const llama_context * ctx);

// The most cells a store of the usual layout holds in any layer, or (sliding_only) in an iSWA model's sliding-window
// layers only (0 without such layers). A ragged cache's layers are left out: their stores hold rows of single heads.
int32_t store_cells(const llama_context * ctx, bool sliding_only);

// Cells a context needs beyond what it holds so that an iSWA model's sliding-window cache (sized by llama.cpp from
// n_ctx, at most the window plus a ubatch) keeps the whole window: the window, 0 for other models.
int32_t window_cells(const llama_model * model);

// An iSWA model's sliding-window cache of sequence 0 (its last window of cells, llama.cpp's partial state): read (empty
// for other models), and written back, replacing what the cache holds (nothing for an empty one). Throw ecokv::error.
std::vector<uint8_t> read_window(llama_context * ctx);
void                 write_window(llama_context * ctx, const std::vector<uint8_t> & window);

// The sequence state of `seq` (llama_state_seq_get_data); throws ecokv::error when llama.cpp gives none.
std::vector<uint8_t> read_sequence(llama_context * ctx, llama_seq_id seq = 0);
// The cell count in the header of a state, without parsing the rest (0 for a too short buffer).
uint32_t state_cell_count(const std::vector<uint8_t> & bytes);


// Whether the kept rows of a store are gathered where it lies (a ggml graph on its device, make_ragged) rather than
// through host memory: stores in device memory whose rows of one head are whole 4-byte words. The environment's
// ECOKV_GATHER_ON_BACKEND=1 takes that path for host stores too (the CPU backend), so that a CPU build tests it; =0
// never takes it.
bool gathers_on_backend(const ggml_tensor * store, int32_t n_kv_heads);

// Cells [0, n_cells) of a cache in the usual layout (cell t is prompt token t) as [n_kv_heads, n_cells, head_dim]
// views of its K and V stores: no copy where the stores are in host memory; a transposed V store (a context made
// without flash attention) or a device store is copied, one layer at a time. Values are copied from a device only
// with `values` (a method reads them) or where make_ragged cannot gather them on the device; otherwise their views
// have the shape and no data.
class cache_views {
  public:
    cache_views(const llama_context * ctx, int32_t n_cells, bool values = true);

    int32_t     n_layers() const { return int32_t(k_.size()); }
    tensor_view keys(int32_t il) const { return k_[il]; }
    tensor_view values(int32_t il) const { return v_[il]; }
    uint64_t    bytes_to_host() const { return bytes_to_host_; }  // copied from device stores

  private:
    std::vector<tensor_view>          k_, v_;
    std::vector<std::vector<uint8_t>> owned_;  // copies, where the stores could not be viewed
    uint64_t                          bytes_to_host_ = 0;
};

// Where candidate i of (layer il, KV head h) lies in a context's stores, counted in rows of one head: cell i of the
// usual layout (row i * n_kv_heads + h), or entry i of a ragged cache of `layout` and room `n_room`, its label row
// skipped (kept entries, then the cells decoded into the room).
struct candidate_rows {
    const llama_context * ctx = nullptr;  // whose stores: the compressed context itself, or the prefilled one
    int32_t               n_kv_heads = 0;
    std::vector<uint32_t> layout;  // empty: the usual layout
    int32_t               n_room = 0;

    // align: the stores' llama_kv_ragged_row_align for layer il
    int64_t row(int32_t il, int32_t h, int32_t i, uint32_t align = 1) const;
};

// The candidates of a ragged cache into whose room n_new tokens were decoded (chunked prefill): for every (layer, KV
// head), its kept entries then the new tokens' rows (the label row between them left out), copied into buffers of
// this object, as capture_view::heads. `n_keep` is the cache's layout, n_room the room it was made with.
class ragged_candidates {
  public:
    // Values are copied where a method reads them (`values`) or make_ragged cannot gather them on the backend.
    ragged_candidates(const llama_context * ctx, const std::vector<uint32_t> & n_keep, int32_t n_room, int32_t n_new,
                      bool values = true);

    std::vector<head_tokens> heads() const;  // views of the copies; modality left empty
    uint64_t                 bytes_to_host() const { return bytes_to_host_; }  // copied from device stores

  private:
    std::vector<std::vector<uint8_t>> k_, v_;  // [n_layers * n_kv_heads] rows in the store's type
    std::vector<int64_t>              rows_;   // candidates per head
    std::vector<size_t>               k_row_, v_row_;  // bytes per row, per layer
    std::vector<ggml_type>            k_type_, v_type_;
    std::vector<int32_t>              k_dim_, v_dim_;  // elements per row (head_dim), per layer
    std::vector<bool>                 v_copied_;       // per layer
    int32_t                           n_kv_ = 0;
    uint64_t                          bytes_to_host_ = 0;
};

// Replaces the cache of ctx by a ragged one holding what `sel` keeps of the keys and values of `src` (the rows a
// merge method rewrote instead of the originals; per-head token sets too) and room for n_room tokens, the kept
// entries standing at position pos. `src` may view ctx's own cache: it is read before the old stores are freed.
// Where gathers_on_backend, the kept rows are copied from ctx's stores (`from` says where candidate i lies) to the
// new ones by a graph of get_rows on their device, without passing through the host; src is read elsewhere.
// Throws ecokv::error, leaving ctx as it was.
void make_ragged(llama_context * ctx, const capture_view & src, const selection & sel, int32_t n_room, llama_pos pos,
                 const candidate_rows & from);

// The kept entries per (layer, KV head) of a selection, the layout llama_kv_set_ragged takes.
std::vector<uint32_t> ragged_layout(const selection & sel);

}  // namespace ecokv::llama
