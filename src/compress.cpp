// compress(): statistics -> allocation -> scores -> selection (-> merge), threaded over (layer, KV head).
//
// Each (layer, KV head) is checked for NaN, measured, scored and selected in one task, so its K and V are
// read from memory about once. Allocators that need every head's statistics first (AdaKV, MadaKV) split
// the task in two around the allocation.
#include "ecokv/compress.h"

#include "impl.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"
#include "method-impl.h"
#include "select.h"

#include <algorithm>
#include <numeric>

namespace ecokv {

namespace {

uint64_t entry_bytes(const capture_view & cap) {
    const head_view h = cap.head(0, 0);
    return uint64_t(h.keys.row_bytes()) + uint64_t(h.values.row_bytes());
}

// One compression run: the validated method and its per-head state.
class run {
  public:
    run(const capture_view & cap, const method_spec & spec, const method_params & params,
        const compress_options & options) :
        cap_(cap),
        spec_(spec),
        params_(params),
        scorer_e_(find_scorer(spec.scorer)),
        alloc_e_(find_allocator(spec.allocator)),
        n_window_(method_window(spec, params)),
        n_threads_(options.n_threads),
        n_keep_last_(options.n_keep_last),
        needs_(scorer_e_.needs | alloc_e_.needs) {
        params.validate(n_window_);
        cap.validate();
        if ((needs_ & stat_window_attention) && n_window_ > cap.n_queries) {
            ECOKV_THROW("%s %d exceeds the %d window queries the capture holds", option_name("window").c_str(),
                        n_window_, cap.n_queries);
        }
        if ((needs_ & stat_accum_attention) && !cap.has_full_queries()) {
            ECOKV_THROW("method %s needs the queries of every prompt token; capture with --full-queries",
                        spec.name().c_str());
        }
        if (requirements(spec, params).values && !cap.has_values()) {
            ECOKV_THROW("method %s reads the value rows, which the capture does not hold", spec.name().c_str());
        }
        stats_.resize(n_heads());
    }

    int32_t n_window() const { return n_window_; }
    size_t  n_heads() const { return size_t(cap_.n_layers) * cap_.n_kv_heads; }
    int32_t n_tokens(size_t i) const { return cap_.head(layer(i), head(i)).n_tokens; }  // T of head i
    int32_t n_prefix(size_t i) const { return n_tokens(i) - n_window_; }
    // The prefix tokens the selection chooses among: those before the protected last tokens (n_keep_last).
    int32_t n_choosable(size_t i) const { return std::max(0, n_tokens(i) - std::max(n_window_, n_keep_last_)); }

    // Runs head_fn(i, budget) for every head; the allocation is made before (from all statistics) or
    // per head (allocators that need none).
    template <typename Fn> void for_each_head(Fn && head_fn) {
        allocation alloc;
        if (alloc_e_.needs != 0) {
            kernels::parallel_for(int64_t(n_heads()), n_threads_, [&](int64_t i) { measure(size_t(i)); });
            alloc = alloc_e_.make()->allocate({ cap_, params_, n_window_, stats_ });
        } else {
            alloc = alloc_e_.make()->allocate({ cap_, params_, n_window_, {} });
        }
        ECOKV_ASSERT(alloc.budget.size() == n_heads());
        kernels::parallel_for(int64_t(n_heads()), n_threads_, [&](int64_t i) {
            measure(size_t(i));
            const head_budget b{ std::clamp(alloc.budget[i], 0, n_choosable(size_t(i))),
                                 alloc.budget_image.empty() ? -1 : alloc.budget_image[i], alloc.text_first };
            head_fn(size_t(i), b);
            stats_[i] = {};  // release as we go
        });
    }

    // The attention every token of head i accumulated (methods that accumulate it; else empty).
    const std::vector<float> & accumulated(size_t i) const { return stats_[i].attn_accum; }
    // The same where nothing else is measured (a head kept whole).
    std::vector<float> accumulated_alone(size_t i) const {
        std::vector<float> out;
        if (needs_ & stat_accum_attention) {
            out.resize(size_t(n_tokens(i)));
            kernels::accumulated_attention(cap_, layer(i), head(i), out);
        }
        return out;
    }

    std::vector<double> score(size_t i) const {
        std::vector<double> s(static_cast<size_t>(n_prefix(i)), 0.0);
        scorer_->score({ cap_, params_, layer(i), head(i), n_window_, stats_[i] }, s);
        return s;
    }

    int32_t layer(size_t i) const { return int32_t(i / cap_.n_kv_heads); }
    int32_t head(size_t i) const { return int32_t(i % cap_.n_kv_heads); }

  private:
    // NaN check and statistics of head i, once.
    void measure(size_t i) {
        head_stats & st = stats_[i];
        if (st.measured) {
            return;
        }
        cap_.check_finite(layer(i), head(i));
        if (needs_ & stat_window_attention) {
            st.attn_raw.resize(size_t(n_prefix(i)));
            kernels::window_attention(cap_, layer(i), head(i), n_window_, st.attn_raw);
        }
        if (needs_ & stat_accum_attention) {  // every token's: the kept ones' go on (streaming H2O)
            st.attn_accum.resize(size_t(n_tokens(i)));
            kernels::accumulated_attention(cap_, layer(i), head(i), st.attn_accum);
        }
        st.measured = true;
    }

    const capture_view &    cap_;
    const method_spec &     spec_;
    const method_params &   params_;
    const scorer_entry &    scorer_e_;
    const allocator_entry & alloc_e_;
    const int32_t           n_window_;
    const int32_t           n_threads_;
    const int32_t           n_keep_last_;
    const unsigned          needs_;
    const scorer_ptr        scorer_ = scorer_e_.make();
    std::vector<head_stats> stats_;  // [n_layers * n_kv_heads]
};

}  // namespace

size_t selection::n_kept() const {
    size_t n = 0;
    for (const auto & layer : layers) {
        for (const head_selection & h : layer) {
            n += h.kept.size();
        }
    }
    return n;
}

selection compress(const capture_view & cap, const method_spec & spec, const method_params & params,
                   const compress_options & options) {
    run       r(cap, spec, params, options);
    selection sel;
    sel.method   = spec.name();
    sel.budget   = params.budget;
    sel.window   = r.n_window();
    sel.n_tokens = cap.n_tokens;
    sel.layers.assign(size_t(cap.n_layers), std::vector<head_selection>(size_t(cap.n_kv_heads)));
    auto head_of = [&](size_t i) -> head_selection & { return sel.layers[i / cap.n_kv_heads][i % cap.n_kv_heads]; };
    uint64_t n_entries = 0;
    for (size_t i = 0; i < r.n_heads(); ++i) {
        n_entries += uint64_t(r.n_tokens(i));
    }
    sel.kv_bytes_full = n_entries * entry_bytes(cap);

    if (cap.n_tokens <= params.budget) {  // SPEC §2: nothing to compress anywhere
        cap.check_finite();
        for (size_t i = 0; i < r.n_heads(); ++i) {
            head_of(i).kept.resize(size_t(r.n_tokens(i)));
            std::iota(head_of(i).kept.begin(), head_of(i).kept.end(), 0);
            head_of(i).accumulated = r.accumulated_alone(i);  // what an accumulating method carries on
            if (params.merge == merge_kind::pivot) {  // nothing evicted: the rows are the originals
                merge_pivot(cap, r.layer(i), r.head(i), r.n_window(), head_of(i));
            }
        }
    } else {
        r.for_each_head([&](size_t i, const head_budget & b) {
            // A head whose budget covers what it may choose keeps everything without scoring.
            const int32_t             n_choosable = r.n_choosable(i);
            const std::vector<double> s = b.prefix < n_choosable ? r.score(i)
                                                                 : std::vector<double>(size_t(r.n_prefix(i)), 0.0);
            head_selection & h = head_of(i);
            h.kept             = select_head(std::span(s).first(size_t(n_choosable)), b, cap.head(r.layer(i), r.head(i)));
            for (const int32_t t : r.accumulated(i).empty() ? std::vector<int32_t>{} : h.kept) {
                h.accumulated.push_back(r.accumulated(i)[size_t(t)]);
            }
            if (params.merge == merge_kind::pivot) {
                merge_pivot(cap, r.layer(i), r.head(i), r.n_window(), head_of(i));
            }
        });
    }
    sel.kv_bytes_kept = uint64_t(sel.n_kept()) * entry_bytes(cap);
    return sel;
}

std::vector<std::vector<float>> accumulated_attention(const capture_view & cap, const compress_options & options) {
    cap.validate();
    if (!cap.has_full_queries()) {
        ECOKV_THROW("accumulated attention needs the capture's full queries");
    }
    std::vector<std::vector<float>> out(size_t(cap.n_layers) * cap.n_kv_heads);
    kernels::parallel_for(int64_t(out.size()), options.n_threads, [&](int64_t i) {
        const int32_t il = int32_t(i / cap.n_kv_heads), ig = int32_t(i % cap.n_kv_heads);
        cap.check_finite(il, ig);
        out[size_t(i)].resize(size_t(cap.head(il, ig).n_tokens));
        kernels::accumulated_attention(cap, il, ig, out[size_t(i)]);
    });
    return out;
}

std::vector<std::vector<double>> score_heads(const capture_view & cap, const method_spec & spec,
                                             const method_params & params, const compress_options & options) {
    run                              r(cap, spec, params, options);
    std::vector<std::vector<double>> out(r.n_heads());
    if (cap.n_tokens > r.n_window()) {
        r.for_each_head([&](size_t i, const head_budget &) { out[i] = r.score(i); });
    }
    return out;
}

}  // namespace ecokv
