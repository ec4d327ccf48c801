// ecokv: compress a capture with a method: which tokens every (layer, KV head) keeps (SPEC §2, §8).
#pragma once

#include "ecokv/capture.h"
#include "ecokv/method.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ecokv {

struct head_selection {
    std::vector<int32_t> kept;  // ascending token indices (into the head's own tokens when capture_view::heads is set)
    // With a merge method, the rewritten rows of the kept tokens, else empty:
    std::vector<float> keys;    // [kept.size()][head_dim]
    std::vector<float> values;  // [kept.size()][head_dim_v]
    // Methods that accumulate attention (H2O): what each kept token accumulated, its prior included; the prior of
    // the next compression's capture (streaming H2O). Else empty.
    std::vector<float> accumulated;
};

struct selection {
    std::string method;  // canonical name
    int32_t     budget   = 0;
    int32_t     window   = 0;
    int32_t     n_tokens = 0;

    std::vector<std::vector<head_selection>> layers;  // [n_layers][n_kv_heads]

    uint64_t kv_bytes_full = 0;  // L * Hkv * T * (D * key size + Dv * value size)
    uint64_t kv_bytes_kept = 0;  // the same over kept entries only

    size_t n_kept() const;  // kept entries over all layers and heads
};

struct compress_options {
    int32_t n_threads = 0;  // 0: all hardware threads
    // The last n_keep_last tokens of every head are kept beside the budget, which then covers the tokens before them
    // (window included): an engine's rule for a conversation's last turn (docs/conversations.md). Scores and
    // allocation are computed as without it; the protected tokens only leave the choice. 0: the window alone.
    int32_t n_keep_last = 0;
};

// Selects the kept tokens of every (layer, KV head). Validates the parameters, the capture's shapes
// and that its data is finite; throws ecokv::error on any problem (nothing is returned half-done).
selection compress(const capture_view & cap, const method_spec & spec, const method_params & params,
                   const compress_options & options = {});

// The score S over P = [0, T - N) of every (layer, KV head), index il * n_kv_heads + ig, exactly as compress()
// ranks them (SPEC §5): for analyses and tests. Same validation and errors as compress().
std::vector<std::vector<double>> score_heads(const capture_view & cap, const method_spec & spec,
                                             const method_params & params, const compress_options & options = {});

// Streaming H2O's running sums: per (layer, KV head), index il * n_kv_heads + ig, the attention each token accumulated
// from the capture's full queries (causal, mean over the group) plus its prior_attention. Throws ecokv::error for a
// capture without full queries.
std::vector<std::vector<float>> accumulated_attention(const capture_view & cap, const compress_options & options = {});

// Writes the selection JSON of SPEC §8 atomically. Merged rows, if any, are not part of the JSON:
// write them with write_merged_rows().
void write_selection_json(const std::string & path, const selection & sel);

// Writes the merged K/V rows of a merge method as safetensors: "layers.{l}.heads.{g}.keys" [n_kept, D]
// and ".values" [n_kept, Dv], F32. Throws if the selection has no merged rows.
void write_merged_rows(const std::string & path, const selection & sel);

}  // namespace ecokv
