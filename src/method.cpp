// The ALLOCATOR+SCORER grammar (SPEC §6), what a method requires, and the method list (ranges: options.cpp).
#include "ecokv/method.h"

#include "impl.h"
#include "method-impl.h"

#include <algorithm>
#include <cmath>

namespace ecokv {

std::string method_spec::name() const {
    return allocator + "+" + scorer;
}

method_spec parse_method(std::string_view text) {
    const size_t plus = text.find('+');
    if (plus == std::string_view::npos) {
        for (const scorer_entry & e : scorer_registry()) {
            if (text == e.name) {
                return { "uniform", e.name };
            }
        }
        for (const allocator_entry & e : allocator_registry()) {
            if (text == e.name) {
                return { e.name, e.default_scorer };
            }
        }
        std::string known;
        for (const method_info & m : list_methods()) {
            known += (known.empty() ? "" : ", ") + m.name;
        }
        ECOKV_THROW("unknown method '%.*s'; known: %s (or ALLOCATOR+SCORER)", int(text.size()), text.data(),
                    known.c_str());
    }
    std::string_view alloc  = text.substr(0, plus);
    std::string_view scorer = text.substr(plus + 1);
    if (scorer.find('+') != std::string_view::npos) {
        ECOKV_THROW("method '%.*s': expected ALLOCATOR+SCORER with one '+'", int(text.size()), text.data());
    }
    if (alloc == "snapkv") {  // "SnapKV + ECOKV" in the paper: SnapKV's uniform budget, ECOKV's scores
        alloc = "uniform";
    }
    return { find_allocator(alloc).name, find_scorer(scorer).name };
}

int32_t method_window(const method_spec & spec, const method_params & params) {
    return params.window >= 0 ? params.window : find_scorer(spec.scorer).default_window;
}

method_requirements & method_requirements::operator|=(const method_requirements & other) {
    n_window_queries = std::max(n_window_queries, other.n_window_queries);
    full_queries     = full_queries || other.full_queries;
    modality         = modality || other.modality;
    head_scores      = head_scores || other.head_scores;
    values           = values || other.values;
    return *this;
}

method_requirements requirements(const method_spec & spec, const method_params & params) {
    const scorer_entry &    s     = find_scorer(spec.scorer);
    const allocator_entry & a     = find_allocator(spec.allocator);
    const unsigned          needs = s.needs | a.needs;
    return { method_window(spec, params), (needs & stat_accum_attention) != 0, (a.inputs & input_modality) != 0,
             (a.inputs & input_head_scores) != 0, (needs & stat_values) != 0 || params.merge != merge_kind::none };
}

void check_chunk(const method_spec & spec, const method_params & params, int32_t n_chunk) {
    const method_requirements needs = requirements(spec, params);
    if (n_chunk <= needs.n_window_queries) {
        throw option_error("chunk", detail::format("%s %d must be larger than the window of %d",
                                                   option_name("chunk").c_str(), n_chunk, needs.n_window_queries));
    }
}

void check_recompression(const method_spec & spec, const method_params & params, int32_t every) {
    const method_requirements needs = requirements(spec, params);
    if (every > 0 && every <= needs.n_window_queries) {
        throw option_error("decode_compress", detail::format("%s %d must be larger than the window of %d",
                                                             option_name("decode_compress").c_str(), every,
                                                             needs.n_window_queries));
    }
}

std::vector<method_info> list_methods() {
    std::vector<method_info> out;
    for (const scorer_entry & e : scorer_registry()) {
        out.push_back({ e.name, "scorer", e.description, "window " + std::to_string(e.default_window) });
    }
    for (const allocator_entry & e : allocator_registry()) {
        out.push_back(
            { e.name, "allocator", e.description, std::string("scorer ") + e.default_scorer, e.fixed_budget });
    }
    return out;
}

}  // namespace ecokv
