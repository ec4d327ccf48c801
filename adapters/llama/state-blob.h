// ecokv-llama internals: the per-sequence state blob of llama.cpp 0.5.0 (llama_state_seq_get_data).
//
// Layout (src/llama-context.cpp:3142-3173, src/llama-kv-cache.cpp:2055-2335 of the pinned tree):
//   u32 magic 0xaf143cd8, i32 seq_id, u32 n_stream (1), u32 cell_count,
//   cell_count x { i32 pos, u32 n_seq_id, [llama_kv_cell_ext: i32 x, i32 y, i32 tok], n_seq_id x i32 },
//   u32 v_trans, u32 n_layer,
//   n_layer x { i32 k_type, u64 k_row_bytes, cell_count rows },
//   v_trans = 0: n_layer x { i32 v_type, u64 v_row_bytes, cell_count rows }
//   v_trans = 1: n_layer x { i32 v_type, u32 el_bytes, u32 n_embd_v, n_embd_v x cell_count elements }
// The format has no version: tests/llama round-trips it against the pinned tree.
#pragma once

#include "ecokv/tensor.h"

#include <llama.h>

#include <cstdint>
#include <vector>

namespace ecokv::llama {

struct cell_meta {
    int32_t pos = 0;
    int32_t ext[3] = { 0, 0, -1 };  // M-RoPE x, y and the token id (LLAMA_TOKEN_NULL = -1)
};

// The sequence state of `seq` (llama_state_seq_get_data); throws ecokv::error when llama.cpp gives none.
std::vector<uint8_t> read_sequence(llama_context * ctx, llama_seq_id seq = 0);

// Whether the model's cache keeps llama_kv_cell_ext per cell (M-RoPE), which the state then carries.
bool uses_cell_ext(const llama_model * model);

class state_blob {
  public:
    // Reads the state of sequence 0 of ctx.
    explicit state_blob(llama_context * ctx);

    // The cell count in the header of a state, without parsing the rest (0 for a too short buffer).
    static uint32_t cell_count(const std::vector<uint8_t> & bytes);

    // Parses `bytes` (copied); has_ext: the model keeps llama_kv_cell_ext per cell (M-RoPE). n_kv_heads
    // splits each cache row into heads. Throws ecokv::error on anything unexpected.
    state_blob(std::vector<uint8_t> bytes, bool has_ext, int32_t n_kv_heads);

    int32_t n_cells() const { return n_cells_; }
    int32_t n_layers() const { return int32_t(k_off_.size()); }
    int32_t head_dim_k() const { return head_dim_k_; }
    int32_t head_dim_v() const { return head_dim_v_; }
    bool    v_trans() const { return v_trans_; }
    int32_t pos_max() const;
    uint64_t bytes_per_cell() const;  // K + V of one cell over all layers
    // Forgets every cell from n on (tokens decoded after the prompt); the views and compacted() see n cells.
    void    keep_first(int32_t n);
    const std::vector<cell_meta> & cells() const { return cells_; }

    // [n_kv_heads, n_cells, head_dim] views into the blob (no copy). With v_trans the values are
    // transposed once into an owned buffer.
    tensor_view keys(int32_t il) const;
    tensor_view values(int32_t il) const;

    // A blob of n = the longest list cells whose cell i of (layer l, KV head g) holds token kept[l][g][i]'s K
    // and V; cells past a shorter list are zero padding, to be hidden with a per-head bias. Cells are labelled
    // with positions pos_max - n + 1 + i (clipped at 0), which keeps decoding at the original positions: K is
    // stored after RoPE, labels only order the mask.
    std::vector<uint8_t> compacted(const std::vector<std::vector<std::vector<int32_t>>> & kept, int32_t seq_id) const;

  private:
    std::vector<uint8_t>   bytes_;
    bool                   has_ext_;
    int32_t                n_kv_heads_;
    int32_t                n_cells_ = 0;
    bool                   v_trans_ = false;
    int32_t                head_dim_k_ = 0, head_dim_v_ = 0;
    dtype                  k_type_ = dtype::f16, v_type_ = dtype::f16;
    std::vector<cell_meta> cells_;
    std::vector<size_t>    k_off_, v_off_;  // [n_layers] offset of the first row
    size_t                 k_row_ = 0, v_row_ = 0;  // bytes per row (v_trans: bytes per element)
    std::vector<std::vector<uint8_t>> v_transposed_;  // [n_layers] row-major copy when v_trans
};

}  // namespace ecokv::llama
