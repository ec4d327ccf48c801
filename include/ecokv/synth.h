// ecokv: realistic random captures for demos, tests and benchmarks (no model needed).
#pragma once

#include "ecokv/capture.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ecokv {

struct synth_params {
    int32_t  n_layers     = 4;
    int32_t  n_heads      = 8;
    int32_t  n_kv_heads   = 4;
    int32_t  head_dim     = 64;
    int32_t  head_dim_v   = 0;     // 0: head_dim
    int32_t  n_tokens     = 512;
    int32_t  n_queries    = 32;    // window queries captured (SPEC §7 asks for at least 32)
    bool     full_queries = false; // also capture the queries of every token (h2o, lookm)
    dtype    type         = dtype::f32;
    uint64_t seed         = 0;
    std::vector<std::pair<int32_t, int32_t>> image_spans;  // [begin, end) token ranges of image tokens

    void validate() const;  // throws ecokv::error naming the option
};

// A capture that owns its data. Keys are anisotropic (a shared direction, a few dominant channels), token
// norms vary, image tokens form spatially correlated clusters, attention sinks have large keys, RoPE is
// applied to keys and queries, and queries attend sharply to a few salient tokens.
class owned_capture {
  public:
    const capture_view & view() const { return view_; }

  private:
    friend owned_capture make_synth_capture(const synth_params & params);
    capture_view                        view_;
    std::vector<std::vector<std::byte>> storage_;
};

// Deterministic: the same parameters give the same bytes on every run and thread count.
owned_capture make_synth_capture(const synth_params & params);

}  // namespace ecokv
