// THE list of methods: one line per scorer and per allocator. --list-methods, --help, the README table and
// the test matrix all read it.
#include "impl.h"
#include "method-impl.h"

#include <string>

namespace ecokv {

namespace scorers {
scorer_ptr make_snapkv();
scorer_ptr make_knorm();
scorer_ptr make_knorm_only();
scorer_ptr make_vnorm();
scorer_ptr make_keydiff();
scorer_ptr make_manifoldkv();
scorer_ptr make_mixkv();
scorer_ptr make_ecokv();
scorer_ptr make_h2o();
scorer_ptr make_streamingllm();
scorer_ptr make_random();
}  // namespace scorers

namespace allocators {
allocator_ptr make_uniform();
allocator_ptr make_pyramidkv();
allocator_ptr make_adakv();
allocator_ptr make_sparsemm();
allocator_ptr make_madakv();
allocator_ptr make_lookm();
}  // namespace allocators

namespace {

constexpr unsigned k_attn  = stat_window_attention;
constexpr unsigned k_accum = stat_accum_attention;
constexpr unsigned k_vals  = stat_values;
constexpr unsigned k_mod   = input_modality;
constexpr unsigned k_hs    = input_head_scores;

// Columns: name, description, default window N, stat_flags, factory.
// clang-format off
const scorer_entry k_scorers[] = {
    { "snapkv",       "pooled window attention (SnapKV, arXiv:2404.14469)",                      32, k_attn,  scorers::make_snapkv },
    { "knorm",        "attention + low key norm (KNorm, arXiv:2406.11430; MixKV form)",          32, k_attn,  scorers::make_knorm },
    { "knorm-only",   "low key norm alone, attention-free (arXiv:2406.11430)",                   32, 0,       scorers::make_knorm_only },
    { "vnorm",        "attention + value norm (InfiniPot-V arXiv:2506.15745; MixKV form)",       32, k_attn | k_vals, scorers::make_vnorm },
    { "keydiff",      "key dissimilarity to the mean key direction (KeyDiff, arXiv:2504.15364)", 32, 0,       scorers::make_keydiff },
    { "manifoldkv",   "Euclidean distance to the key centroid (ManifoldKV, arXiv:2602.08343)",   32, 0,       scorers::make_manifoldkv },
    { "mixkv",        "importance + cosine diversity by head redundancy (MixKV, arXiv:2510.20707)", 32, k_attn | k_vals, scorers::make_mixkv },
    { "ecokv",        "importance + Euclidean/cosine diversity, head-adaptive (ECOKV)",          4,  k_attn | k_vals, scorers::make_ecokv },
    { "h2o",          "accumulated causal attention of all prompt queries (H2O, arXiv:2306.14048)", 32, k_accum, scorers::make_h2o },
    { "streamingllm", "4 attention sinks + the most recent tokens (StreamingLLM, arXiv:2309.17453)", 4, 0,    scorers::make_streamingllm },
    { "random",       "uniform random scores (--seed)",                                          32, 0,       scorers::make_random },
};
// clang-format on

// Columns: name, description, default scorer, stat_flags, input_flags, fixed_budget (every head keeps min(T, B)),
// factory.
// clang-format off
const allocator_entry k_allocators[] = {
    { "uniform",   "the same budget B for every layer and KV head",                                    "snapkv", 0,      0,     true,  allocators::make_uniform },
    { "pyramidkv", "layer budgets falling linearly with depth (PyramidKV, arXiv:2406.02069)",          "snapkv", 0,      0,     false, allocators::make_pyramidkv },
    { "adakv",     "head budgets from attention concentration (AdaKV, arXiv:2407.11550)",              "snapkv", k_attn, 0,     false, allocators::make_adakv },
    { "sparsemm",  "static head budgets from visual-head scores (SparseMM, arXiv:2506.05344)",         "snapkv", 0,      k_hs,  false, allocators::make_sparsemm },
    { "madakv",    "modality split per head + cross-layer compensation (MadaKV, ACL 2025)",            "snapkv", k_attn, k_mod, false, allocators::make_madakv },
    { "lookm",     "text tokens before image tokens, optional pivot merge (LOOK-M, arXiv:2406.18139)", "h2o",    0,      k_mod, true,  allocators::make_lookm },
};
// clang-format on

template <typename Entry> std::string names(std::span<const Entry> entries) {
    std::string out;
    for (const Entry & e : entries) {
        out += (out.empty() ? "" : ", ") + std::string(e.name);
    }
    return out;
}

}  // namespace

// The method front ends use when none is given: the ECOKV paper's "SnapKV + ECOKV".
constexpr std::string_view k_default_method = "snapkv+ecokv";

method_spec default_method() { return parse_method(k_default_method); }

std::span<const scorer_entry> scorer_registry() { return k_scorers; }
std::span<const allocator_entry> allocator_registry() { return k_allocators; }

const scorer_entry & find_scorer(std::string_view name) {
    for (const scorer_entry & e : k_scorers) {
        if (name == e.name) {
            return e;
        }
    }
    ECOKV_THROW("unknown scorer '%.*s'; known: %s", int(name.size()), name.data(),
                names(scorer_registry()).c_str());
}

const allocator_entry & find_allocator(std::string_view name) {
    for (const allocator_entry & e : k_allocators) {
        if (name == e.name) {
            return e;
        }
    }
    ECOKV_THROW("unknown allocator '%.*s'; known: %s", int(name.size()), name.data(),
                names(allocator_registry()).c_str());
}

}  // namespace ecokv
