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
    const scorer_entry &    scorer_e = find_scorer(spec.scorer);
    const allocator_entry & alloc_e  = find_allocator(spec.allocator);
    const int32_t           n_window = method_window(spec, params);
    const unsigned          needs    = scorer_e.needs | alloc_e.needs;
    params.validate(n_window);
    check_capture(cap, spec, n_window, needs);

    const int32_t t_all    = cap.n_tokens;
    const int32_t n_prefix = t_all - n_window;
    const size_t  n_heads  = size_t(cap.n_layers) * cap.n_kv_heads;
    const int32_t threads  = thread_count(options);

    selection sel;
    sel.method   = spec.name();
    sel.budget   = params.budget;
    sel.window   = n_window;
    sel.n_tokens = t_all;
    sel.layers.assign(size_t(cap.n_layers), std::vector<head_selection>(size_t(cap.n_kv_heads)));
    sel.kv_bytes_full = uint64_t(n_heads) * t_all * entry_bytes(cap);

    auto head_of = [&](size_t i) -> head_selection & { return sel.layers[i / cap.n_kv_heads][i % cap.n_kv_heads]; };
    if (t_all <= params.budget) {  // SPEC §2: nothing to compress anywhere
        for (size_t i = 0; i < n_heads; ++i) {
            head_of(i).kept.resize(size_t(t_all));
            std::iota(head_of(i).kept.begin(), head_of(i).kept.end(), 0);
        }
    } else {
        std::vector<head_stats> stats(n_heads);
        kernels::parallel_for(int64_t(n_heads), threads, [&](int64_t i) {
            const int32_t il = int32_t(i / cap.n_kv_heads), ig = int32_t(i % cap.n_kv_heads);
            if (needs & stat_window_attention) {
                stats[i].attn_raw.resize(size_t(n_prefix));
                kernels::window_attention(cap, il, ig, n_window, stats[i].attn_raw);
            }
            if (needs & stat_accum_attention) {
                stats[i].attn_accum.resize(size_t(n_prefix));
                kernels::accumulated_attention(cap, il, ig, stats[i].attn_accum);
            }
        });
        const allocation alloc = alloc_e.make()->allocate({ cap, params, n_window, stats });
        ECOKV_ASSERT(alloc.budget.size() == n_heads);
        const scorer_ptr scorer = scorer_e.make();
        kernels::parallel_for(int64_t(n_heads), threads, [&](int64_t i) {
            const int32_t il = int32_t(i / cap.n_kv_heads), ig = int32_t(i % cap.n_kv_heads);
            head_budget   b{ std::clamp(alloc.budget[i], 0, n_prefix),
                           alloc.budget_image.empty() ? -1 : alloc.budget_image[i], alloc.text_first };
            std::vector<double> scores(static_cast<size_t>(n_prefix), 0.0);
            if (b.prefix < n_prefix) {  // a head whose budget covers P keeps everything without scoring
                scorer->score({ cap, params, il, ig, n_window, stats[i] }, scores);
            }
            head_of(size_t(i)).kept = select_head(scores, b, t_all, cap);
            if (params.merge == merge_kind::pivot) {
                merge_pivot(cap, il, ig, n_window, head_of(size_t(i)));
            }
        });
    }
    sel.kv_bytes_kept = uint64_t(sel.n_kept()) * entry_bytes(cap);
    return sel;
}

}  // namespace ecokv
