// ecokv: the capture of one prefill (SPEC §7): post-RoPE K, V and window queries of every layer.
#pragma once

#include "ecokv/tensor.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ecokv {

enum class modality : uint8_t { text = 0, image = 1, audio = 2 };

struct layer_capture {
    tensor_view keys;          // [n_kv_heads][n_tokens][head_dim]    post-RoPE
    tensor_view values;        // [n_kv_heads][n_tokens][head_dim_v]
    tensor_view queries;       // [n_heads][n_queries][head_dim]      the last n_queries prompt tokens
    tensor_view full_queries;  // [n_heads][n_tokens][head_dim]       optional (h2o); empty() when absent
};

// The tokens one (layer, KV head) holds when heads hold different ones: a cache compressed before and extended
// since (chunked prefill). Rows in position order, so the window (the last n_window tokens) is the same tokens in
// every head.
struct head_tokens {
    tensor_view          keys;      // [1][n][head_dim]
    tensor_view          values;    // [1][n][head_dim_v]
    std::vector<uint8_t> modality;  // [n] values of ecokv::modality; empty means all text
    // Streaming H2O: the attention each token accumulated from queries before this capture's full queries (a
    // compression's head_selection::accumulated, the new tokens' 0), or empty: none.
    std::vector<float> prior_attention;
};

// The K/V rows of one (layer, KV head): slice `slice` of `keys` and `values` holds its n_tokens tokens.
struct head_view {
    const tensor_view &          keys;
    const tensor_view &          values;
    int64_t                      slice;
    int32_t                      n_tokens;
    const std::vector<uint8_t> & modality;

    bool is_text(int32_t t) const { return modality.empty() || modality[t] == uint8_t(modality::text); }
};

// Everything the methods read. Views do not own their data: a capture_file, the engine adapter or the
// caller keeps it alive.
struct capture_view {
    int32_t n_layers   = 0;
    int32_t n_heads    = 0;  // query heads
    int32_t n_kv_heads = 0;
    int32_t head_dim   = 0;  // keys and queries
    int32_t head_dim_v = 0;  // values
    int32_t n_tokens   = 0;
    int32_t n_queries  = 0;  // window queries captured per head (the window N may not exceed it)

    std::vector<layer_capture> layers;    // [n_layers]
    std::vector<uint8_t>       modality;  // [n_tokens] values of ecokv::modality; empty means all text
    std::string                model;     // model name, when known
    // Per (layer, KV head), index il * n_kv_heads + ig, when heads hold different tokens: layers[].keys and
    // .values are then empty, n_tokens is the most any head holds and `modality` is per head. Empty: every head
    // holds tokens [0, n_tokens). Window queries are shared; full_queries, when present, are those of the last
    // full_queries.ne[1] tokens of every head (the tokens new since the last compression), added to each token's
    // prior_attention (streaming H2O).
    std::vector<head_tokens> heads;

    bool has_full_queries() const { return !layers.empty() && !layers[0].full_queries.empty(); }
    // Whether the value rows are there to read: an engine may give only their shape (views without data) to methods
    // that do not read them (method_requirements::values), sparing a copy from a device.
    bool has_values() const {
        return heads.empty() ? !layers.empty() && !layers[0].values.empty() : !heads[0].values.empty();
    }
    bool is_text(int32_t it) const { return modality.empty() || modality[it] == uint8_t(modality::text); }
    // The tokens of (layer il, KV head ig), whichever way the capture holds them.
    head_view head(int32_t il, int32_t ig) const;

    // Checks the dimensions and every view's shape against them; throws ecokv::error naming the tensor.
    void validate() const;
    // Throws ecokv::error naming the first tensor that holds a NaN or an infinity: over the whole capture,
    // or over the slices one (layer, KV head) reads (its keys and values, its group's queries).
    void check_finite() const;
    void check_finite(int32_t il, int32_t ig) const;

  private:
    void validate_heads() const;
};

// A capture read from a safetensors file (memory-mapped; views point into the mapping).
class capture_file {
  public:
    // Opens and validates `path`; throws ecokv::error with the file name and the reason.
    static capture_file open(const std::string & path);

    const capture_view &                       view() const { return view_; }
    const std::map<std::string, std::string> & metadata() const;

  private:
    struct impl;
    std::shared_ptr<const impl> impl_;
    capture_view                view_;
};

// Writes `cap` as SPEC §7 safetensors, keeping each tensor's dtype. Written to a temporary file that is
// renamed into place, so an interrupted write leaves nothing at `path`.
void write_capture(const std::string & path, const capture_view & cap,
                   const std::map<std::string, std::string> & extra_metadata = {});

}  // namespace ecokv
