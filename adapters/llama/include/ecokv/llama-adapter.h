// ecokv-llama: run the ecokv methods inside llama.cpp 0.5.0. The only ecokv code that includes llama.h.
//
// Flow: create the prefill context with a query_capture attached, decode the prompt, wrap the context's cache in a
// prefill_state (keys and values read in place), select with ecokv::compress(), then compress_context() makes a
// ragged cache holding only the kept entries, per layer and KV head, that continues decoding at the original
// positions.
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

    // Recording ends after this many tokens in all (the prompt's, or a chunk's end): rows before its last n_queries
    // are then not read from the graph, unless every query is kept. Without it, each batch's last n_queries are read.
    void        expect_tokens(int32_t n_total);
    int32_t     n_queries() const;               // window rows kept
    // Drops every full-query row recorded so far (a compression used them): the next full_queries() are those of
    // the tokens recorded after this call (streaming H2O).
    void        forget_full_queries();
    uint64_t    bytes_to_host() const;           // query rows read from device memory
    int32_t     n_tokens() const;                // prompt tokens recorded
    std::string error() const;                   // why recording failed (allocation), or empty
    tensor_view queries(int32_t il) const;       // [n_heads, min(n_queries, n_tokens), head_dim] F32
    tensor_view full_queries(int32_t il) const;  // [n_heads, n_tokens, head_dim] F32, or empty

  private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

// Sequence 0 of a prefilled context as an ecokv capture: keys and values are views of the cache's own stores
// (no copy in host memory), queries come from the capture. Cell t is prompt token t (a fresh single-sequence cache
// fills cells in order). The state must not outlive the context's full cache.
class prefill_state {
  public:
    // modality: one entry per prompt token (0 text, 1 image, 2 audio), or empty for a text prompt. n_prompt: the
    // prompt's cells (cells decoded after it, answers, are left out); n_past: the position after the prompt. Without
    // `values` (no method reads them) a device cache's values are not copied to the host (cache_views).
    prefill_state(llama_context * ctx, const query_capture & capture, std::vector<uint8_t> modality, int32_t n_prompt,
                  llama_pos n_past, bool values = true);
    ~prefill_state();

    const capture_view & view() const;
    llama_context *      context() const;
    llama_pos            n_past() const;
    double               seconds() const;        // making the views (copies from a device included)
    uint64_t             bytes_to_host() const;  // K/V copied from device stores, and the queries read

  private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

// A cache holding only the kept KV entries (a ragged cache, patches/llama.cpp).
struct compressed_cache {
    context_ptr ctx;  // the new context; null when compressed in place
    selection   sel;
    double      capture_seconds = 0;  // the prefill's K/V (and queries) made readable by the methods
    double      select_seconds  = 0;
    double      rebuild_seconds = 0;
    uint64_t    bytes_to_host   = 0;  // device -> host for this compression
};

// Selects with method/params on `state` and builds a ragged cache of the kept entries, with room for n_extra more
// tokens, continuing at the prompt's positions: in a new context created from `model` with `cparams` (its full-size
// cache is replaced as the kept entries are written), or, with in_place, in the state's own context, whose full
// cache is freed (the state is then spent). `observer`, when given, is attached to the new context (e.g. to probe
// its attention outputs).
compressed_cache compress_context(const llama_model * model, const prefill_state & state, const method_spec & spec,
                                  const method_params & params, int32_t n_extra, llama_context_params cparams,
                                  query_capture * observer = nullptr, bool in_place = false);

uint64_t kv_bytes_allocated(const llama_context * ctx);  // K and V stores of every layer, as allocated
uint64_t kv_bytes_per_cell(const llama_context * ctx);   // K + V of one token in every KV head and layer
// K + V an uncompressed cache of n_cells holds: every cell in every layer, but an iSWA model's sliding-window layers
// hold at most their window.
uint64_t kv_bytes_of_cells(const llama_context * ctx, int32_t n_cells);

}  // namespace ecokv::llama
