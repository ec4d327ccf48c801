// compress(): statistics -> allocation -> scores -> selection (-> merge), threaded over (layer, KV head).
#include "ecokv/compress.h"

#include "impl.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"
#include "method-impl.h"
#include "select.h"

#include <algorithm>
#include <numeric>
#include <thread>

namespace ecokv {

namespace {

int32_t thread_count(const compress_options & options) {
    return options.n_threads > 0 ? options.n_threads : int32_t(std::max(1u, std::thread::hardware_concurrency()));
}

void check_capture(const capture_view & cap, const method_spec & spec, int32_t n_window, unsigned needs) {
    cap.validate();
    cap.check_finite();
    if ((needs & stat_window_attention) && n_window > cap.n_queries) {
        ECOKV_THROW("--window %d exceeds the %d window queries the capture holds", n_window, cap.n_queries);
    }
    if ((needs & stat_accum_attention) && !cap.has_full_queries()) {
        ECOKV_THROW("method %s needs the queries of every prompt token; capture with --full-queries",
                    spec.name().c_str());
    }
}

uint64_t entry_bytes(const capture_view & cap) {
    return uint64_t(cap.head_dim) * dtype_size(cap.layers[0].keys.type) +
           uint64_t(cap.head_dim_v) * dtype_size(cap.layers[0].values.type);
}

// Everything compress() and score_heads() share: validated method, statistics, allocation.
struct prepared {
    const scorer_entry &    scorer_e;
    const allocator_entry & alloc_e;
    int32_t                 n_window = 0;
    int32_t                 n_threads = 1;
    std::vector<head_stats> stats;  // [n_layers * n_kv_heads]
    allocation              alloc;
};

prepared prepare(const capture_view & cap, const method_spec & spec, const method_params & params,
                 const compress_options & options) {
    prepared p{ find_scorer(spec.scorer), find_allocator(spec.allocator) };
    p.n_window      = method_window(spec, params);
    p.n_threads     = thread_count(options);
    const unsigned needs = p.scorer_e.needs | p.alloc_e.needs;
    params.validate(p.n_window);
    check_capture(cap, spec, p.n_window, needs);
    const int32_t n_prefix = cap.n_tokens - p.n_window;
    if (n_prefix <= 0) {
        return p;  // nothing to score: the window covers the prompt
    }
    p.stats.resize(size_t(cap.n_layers) * cap.n_kv_heads);
    kernels::parallel_for(int64_t(p.stats.size()), p.n_threads, [&](int64_t i) {
        const int32_t il = int32_t(i / cap.n_kv_heads), ig = int32_t(i % cap.n_kv_heads);
        if (needs & stat_window_attention) {
            p.stats[i].attn_raw.resize(size_t(n_prefix));
            kernels::window_attention(cap, il, ig, p.n_window, p.stats[i].attn_raw);
        }
        if (needs & stat_accum_attention) {
            p.stats[i].attn_accum.resize(size_t(n_prefix));
            kernels::accumulated_attention(cap, il, ig, p.stats[i].attn_accum);
        }
    });
    p.alloc = p.alloc_e.make()->allocate({ cap, params, p.n_window, p.stats });
    ECOKV_ASSERT(p.alloc.budget.size() == p.stats.size());
    return p;
}

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
    const size_t  n_heads = size_t(cap.n_layers) * cap.n_kv_heads;
    const int32_t t_all   = cap.n_tokens;
    selection     sel;
    sel.method   = spec.name();
    sel.budget   = params.budget;
    sel.n_tokens = t_all;
    sel.layers.assign(size_t(cap.n_layers), std::vector<head_selection>(size_t(cap.n_kv_heads)));
    sel.kv_bytes_full = uint64_t(n_heads) * t_all * entry_bytes(cap);
    auto head_of = [&](size_t i) -> head_selection & { return sel.layers[i / cap.n_kv_heads][i % cap.n_kv_heads]; };

    if (t_all <= params.budget) {  // SPEC §2: nothing to compress anywhere; still validate everything
        params.validate(method_window(spec, params));
        check_capture(cap, spec, method_window(spec, params), 0);
        sel.window = method_window(spec, params);
        for (size_t i = 0; i < n_heads; ++i) {
            head_of(i).kept.resize(size_t(t_all));
            std::iota(head_of(i).kept.begin(), head_of(i).kept.end(), 0);
        }
    } else {
        const prepared p        = prepare(cap, spec, params, options);
        const int32_t  n_prefix = t_all - p.n_window;
        sel.window              = p.n_window;
        const scorer_ptr scorer = p.scorer_e.make();
        kernels::parallel_for(int64_t(n_heads), p.n_threads, [&](int64_t i) {
            const int32_t il = int32_t(i / cap.n_kv_heads), ig = int32_t(i % cap.n_kv_heads);
            head_budget   b{ std::clamp(p.alloc.budget[i], 0, n_prefix),
                           p.alloc.budget_image.empty() ? -1 : p.alloc.budget_image[i], p.alloc.text_first };
            std::vector<double> scores(size_t(n_prefix), 0.0);
            if (b.prefix < n_prefix) {  // a head whose budget covers P keeps everything without scoring
                scorer->score({ cap, params, il, ig, p.n_window, p.stats[i] }, scores);
            }
            head_of(size_t(i)).kept = select_head(scores, b, t_all, cap);
            if (params.merge == merge_kind::pivot) {
                merge_pivot(cap, il, ig, p.n_window, head_of(size_t(i)));
            }
        });
    }
    sel.kv_bytes_kept = uint64_t(sel.n_kept()) * entry_bytes(cap);
    return sel;
}

std::vector<std::vector<double>> score_heads(const capture_view & cap, const method_spec & spec,
                                             const method_params & params, const compress_options & options) {
    const prepared                   p = prepare(cap, spec, params, options);
    std::vector<std::vector<double>> out(p.stats.size());
    const scorer_ptr                 scorer = p.scorer_e.make();
    kernels::parallel_for(int64_t(out.size()), p.n_threads, [&](int64_t i) {
        const int32_t il = int32_t(i / cap.n_kv_heads), ig = int32_t(i % cap.n_kv_heads);
        out[i].resize(size_t(cap.n_tokens - p.n_window));
        scorer->score({ cap, params, il, ig, p.n_window, p.stats[i] }, out[i]);
    });
    return out;
}

}  // namespace ecokv
