// ecokv internals: the two method interfaces (scorer, allocator) and what they are handed.
// A method is ALLOCATOR+SCORER: the allocator decides how many prefix tokens each (layer, KV head) keeps,
// the scorer ranks the prefix tokens of one head; select.cpp applies SPEC §2 to both.
#pragma once

#include "ecokv/capture.h"
#include "ecokv/method.h"

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace ecokv {

// Per-(layer, KV head) statistics computed once and shared by scorer and allocator.
enum stat_flags : unsigned {
    stat_window_attention = 1u << 0,  // a0 (SPEC §3.1 before pooling)
    stat_accum_attention  = 1u << 1,  // H2O accumulated attention (SPEC §3.4); needs full queries
    stat_values           = 1u << 2,  // the scorer reads value rows (value norms, SPEC §3.2): the capture holds them
};

// Capture fields beyond keys, values and window queries that a method reads.
enum input_flags : unsigned {
    input_modality    = 1u << 0,  // capture_view::modality
    input_head_scores = 1u << 1,  // method_params::head_scores
};

struct head_stats {
    std::vector<float> attn_raw;    // [n_prefix] a0: window attention, mean over window queries and group
    std::vector<float> attn_accum;  // [n_tokens] accumulated causal attention (prior_attention included)
    bool               measured = false;
};

// What a scorer sees of one (layer, KV head).
struct head_input {
    const capture_view &  cap;
    const method_params & params;
    int32_t               il;
    int32_t               ig;
    int32_t               n_window;  // N
    const head_stats &    stats;

    head_view           tokens() const { return cap.head(il, ig); }
    int32_t             n_tokens() const { return tokens().n_tokens; }   // T of this head
    int32_t             n_prefix() const { return n_tokens() - n_window; }  // |P|
    const tensor_view & keys() const { return tokens().keys; }
    const tensor_view & values() const { return tokens().values; }
    int64_t             slice() const { return tokens().slice; }  // the head's slice of keys() and values()
};

class scorer_i {
  public:
    virtual ~scorer_i() = default;
    // Writes the score S of every prefix token j in P = [0, T - N) to out[j]; higher is kept first.
    virtual void score(const head_input & in, std::span<double> out) const = 0;
};

// How the selectable budget of every (layer, KV head) is split; index il * n_kv_heads + ig.
struct allocation {
    std::vector<int32_t> budget;        // C_{l,g}: prefix tokens kept (before capping at |P|)
    std::vector<int32_t> budget_image;  // MadaKV: part of C_{l,g} for non-text tokens; empty: no split
    bool                 text_first = false;  // LOOK-M: every text token ranks before every image token
};

struct allocator_input {
    const capture_view &            cap;
    const method_params &           params;
    int32_t                         n_window;
    std::span<const head_stats>     stats;  // [n_layers * n_kv_heads]
};

class allocator_i {
  public:
    virtual ~allocator_i() = default;
    virtual allocation allocate(const allocator_input & in) const = 0;
};

using scorer_ptr    = std::unique_ptr<scorer_i>;
using allocator_ptr = std::unique_ptr<allocator_i>;

struct scorer_entry {
    const char * name;
    const char * description;
    int32_t      default_window;
    unsigned     needs;  // stat_flags
    scorer_ptr (*make)();
};

struct allocator_entry {
    const char * name;
    const char * description;
    const char * default_scorer;
    unsigned     needs;         // stat_flags
    unsigned     inputs;        // input_flags
    bool         fixed_budget;  // every (layer, KV head) keeps min(T, B) tokens whatever the capture (SPEC §2)
    allocator_ptr (*make)();
};

std::span<const scorer_entry>    scorer_registry();
std::span<const allocator_entry> allocator_registry();
const scorer_entry &             find_scorer(std::string_view name);     // throws with the known names
const allocator_entry &          find_allocator(std::string_view name);  // throws with the known names

}  // namespace ecokv
