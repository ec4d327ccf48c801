// ecokv: method names, the ALLOCATOR+SCORER grammar and the parameters every method reads (SPEC §5-§6).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ecokv {

enum class pool_kind { avg, max };
enum class merge_kind { none, pivot };    // LOOK-M pivot merge of evicted K/V into kept rows
enum class centroid_kind { all, prefix };  // tokens over which ECOKV's mu and kbar are taken
// The two readings of the papers SPEC §5.2 measured to matter; the first of each is normative.
enum class mixkv_scale_kind { attention, importance };  // MixKV's sC matched to mean(a) (code) or mean(Simp) (App. A.1)
enum class ecokv_weights_kind { equations, figure3 };   // alpha, beta weight sE, rE (Eq. 3/6) or sC, rC (Fig. 3 text)

// Every knob of every method, with the SPEC defaults. Fields that do not apply to a method are ignored.
struct method_params {
    int32_t       budget       = 64;    // B: tokens kept per KV head, window included (SPEC §1)
    int32_t       window       = -1;    // N: observation window; -1 takes the scorer's default
    int32_t       kernel       = 5;     // pooling kernel along tokens, odd
    pool_kind     pool         = pool_kind::avg;
    double        alpha        = 0.8;   // ECOKV: weight of the Euclidean diversity in Sdiv (Eq. 3)
    double        beta         = 0.6;   // ECOKV: weight of rE in the redundancy lambda (Eq. 6)
    double        tau          = 0.0;   // ECOKV: temperature of rE; 0 takes sqrt(head_dim)
    centroid_kind centroid     = centroid_kind::all;
    mixkv_scale_kind   mixkv_scale   = mixkv_scale_kind::attention;
    ecokv_weights_kind ecokv_weights = ecokv_weights_kind::equations;
    double        floor_ratio  = -1.0;  // adakv 0.2, sparsemm 0.1, madakv 0.2 when negative
    int32_t       pyramid_beta = 20;    // PyramidKV: ratio of the largest to the smallest layer budget
    double        theta        = 0.9;   // MadaKV: attention mass a head's demand must cover
    int32_t       n_sink       = 4;     // StreamingLLM: leading tokens always kept
    uint64_t      seed         = 0;     // random scorer
    merge_kind    merge        = merge_kind::none;
    std::string   head_scores;          // SparseMM: path of the official head-score JSON

    // Throws ecokv::error naming the option and its bound ("--budget 4 must be larger than --window 8").
    // `window` is the effective window (after defaults).
    void validate(int32_t window) const;
};

// A parsed method name: which allocator splits the budget, which scorer ranks the tokens.
struct method_spec {
    std::string allocator;  // uniform, pyramidkv, adakv, sparsemm, madakv, lookm
    std::string scorer;     // snapkv, knorm, ..., ecokv

    std::string name() const;  // canonical "allocator+scorer"
};

// Parses "ALLOCATOR+SCORER", a bare scorer (uniform), a bare allocator (its paper's scorer) and the alias
// "snapkv+SCORER" (= uniform+SCORER). Throws ecokv::error listing the known names on an unknown one.
method_spec parse_method(std::string_view text);

// The registry's default method (ECOKV scores on SnapKV's uniform budget): what `ecokv run`, analyze and serve use
// without --method.
method_spec default_method();

// The observation window a method uses: params.window when set, otherwise the scorer's default.
int32_t method_window(const method_spec & spec, const method_params & params);

// What a method needs from a capture and from its caller, read from the registry (never from its name), so that
// an engine adapter captures exactly enough and a new method is one file and one registry row.
struct method_requirements {
    int32_t n_window_queries = 0;      // post-RoPE queries of the last prompt tokens the capture must hold
    bool    full_queries     = false;  // queries of every prompt token (accumulated attention: h2o, lookm)
    bool    modality         = false;  // reads the per-token modality map (madakv, lookm)
    bool    head_scores      = false;  // reads params.head_scores (sparsemm)
    bool    values           = false;  // reads the value rows (value norms, merges); else only their shape: an
                                       // engine need not copy them from a device

    // The union of two methods' needs (one capture serving several methods).
    method_requirements & operator|=(const method_requirements & other);
};
method_requirements requirements(const method_spec & spec, const method_params & params);

// Whether the method can compress a chunked prefill with chunks of n_chunk cells: chunks larger than its window (the
// window queries are a chunk's own; H2O's accumulated attention streams from chunk to chunk). Throws ecokv::error
// naming the problem.
void check_chunk(const method_spec & spec, const method_params & params, int32_t n_chunk);
// Whether the method can compress a cache again after the prompt, every `every` decoded cells (0: after an answer):
// a period larger than the window (H2O's accumulated attention streams from one compression to the next).
void check_recompression(const method_spec & spec, const method_params & params, int32_t every);

struct method_info {
    std::string name;
    std::string kind;                  // "scorer" or "allocator"
    std::string description;           // one line, with the paper's arXiv id
    std::string defaults;              // default window / scorer, in words
    bool        fixed_budget = false;  // allocators: every (layer, KV head) keeps exactly min(T, B) tokens, T the
                                       // prompt length (uniform, lookm); false for scorers
};

// Every registered scorer and allocator, in registry order.
std::vector<method_info> list_methods();

}  // namespace ecokv
