// ecokv-llama: run the ecokv methods inside llama.cpp 0.5.0. The only ecokv code that includes llama.h.
//
// Flow: create the prefill context with a query_capture attached, decode the prompt, wrap the context's
// sequence state in a prefill_state (keys and values read from the cache itself), select with
// ecokv::compress(), then compress_context() loads only the kept entries into a new, smaller context that
// continues decoding at the original positions.
#pragma once

#include "ecokv/compress.h"

#include <llama.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ecokv::llama {

struct context_deleter {
    void operator()(llama_context * ctx) const { llama_free(ctx); }
};
using context_ptr = std::unique_ptr<llama_context, context_deleter>;

// Captures the post-RoPE queries (the Qcur-<il> ROPE nodes) of every layer during a prefill through the
// eval callback: the last n_queries prompt tokens, or every token with full_queries (h2o, lookm).
class query_capture {
  public:
    query_capture(const llama_model * model, int32_t n_queries = 32, bool full_queries = false);
    ~query_capture();
    query_capture(const query_capture &)             = delete;
    query_capture & operator=(const query_capture &) = delete;

    // Sets cb_eval in `params`; call before llama_init_from_model. The capture must outlive the context.
    void attach(llama_context_params & params);
    // Only active captures record (switch off after the prefill, before decoding new tokens).
    void set_active(bool active);

    // While probing, every decode records each layer's attention output (the kqv_out-<il> node) for its last
    // token: comparing a compressed cache's with the full one's gives the per-layer attention error.
    void                                    set_probe(bool probe);
    const std::vector<std::vector<float>> & attention_outputs() const;  // [n_layers][n_head * head_dim_v]

    int32_t     n_tokens() const;                // prompt tokens recorded
    std::string error() const;                   // why recording failed (allocation), or empty
    tensor_view queries(int32_t il) const;       // [n_heads, min(n_queries, n_tokens), head_dim] F32
    tensor_view full_queries(int32_t il) const;  // [n_heads, n_tokens, head_dim] F32, or empty

  private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

// Sequence `seq` of a prefilled context as an ecokv capture: keys and values are views of the cache's own
// bytes (llama_state_seq_get_data), queries come from the capture. Cell t is prompt token t (a fresh
// single-sequence cache fills cells in order).
class prefill_state {
  public:
    // modality: one entry per prompt token (0 text, 1 image, 2 audio), or empty for a text prompt. n_prompt, when
    // given, is the prompt's cell count: cells decoded after it (answers) are left out; otherwise the cache must
    // hold exactly the captured prompt.
    prefill_state(llama_context * ctx, const query_capture & capture, std::vector<uint8_t> modality,
                  llama_seq_id seq = 0, int32_t n_prompt = -1);
    ~prefill_state();

    const capture_view & view() const;
    uint64_t             kv_bytes_per_cell() const;  // K + V bytes of one cell over all layers
    int32_t              pos_max() const;            // largest position in the cache

    // The state of a sequence holding only the kept entries of `sel`; heads keeping fewer tokens than the
    // longest are padded (hide the padding with llama_set_kv_head_bias, patches/llama.cpp).
    std::vector<uint8_t> compacted(const selection & sel, llama_seq_id seq = 0) const;

  private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

// A decode context holding only the kept KV entries.
struct compressed_cache {
    context_ptr          ctx;
    selection            sel;
    std::vector<uint8_t> state;                  // the compacted sequence state (restore it into ctx to reuse it)
    std::vector<float>   bias;                   // per-head padding bias (non-uniform budgets), else empty
    int32_t              n_cells          = 0;   // cells holding kept entries
    uint64_t             kv_bytes_alloc   = 0;   // KV bytes allocated by the new context
    uint64_t             kv_bytes_kept    = 0;   // kept entries x bytes per entry
    double               select_seconds   = 0;
    double               rebuild_seconds  = 0;
};

// Selects with method/params on `state` and loads the kept entries into a new context created from
// `model` with `cparams`, its n_ctx set to the kept cells plus n_extra (llama.cpp pads to 256). `cparams` must
// have the prefill context's flash-attention setting: it decides the V layout of the state. The padding bias of
// non-uniform budgets is set on the new context; restoring `state` elsewhere needs `bias` too.
// `observer`, when given, is attached to the new context (e.g. to probe its attention outputs).
compressed_cache compress_context(const llama_model * model, const prefill_state & state, const method_spec & spec,
                                  const method_params & params, int32_t n_extra, llama_context_params cparams,
                                  query_capture * observer = nullptr);

// KV bytes a context allocates: n_ctx cells x bytes per cell.
uint64_t kv_bytes_allocated(const llama_context * ctx, uint64_t bytes_per_cell);

}  // namespace ecokv::llama
