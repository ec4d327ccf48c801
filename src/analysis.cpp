// ecokv: the ECOKV paper's analyses of one capture (include/ecokv/analysis.h). The redundancy terms, importance and
// diversity are ECOKV's own (scorers/ecokv.h), so that the analysis describes exactly what the scorer weighs.
#include "ecokv/analysis.h"

#include "ecokv/error.h"
#include "kernels/kernels.h"
#include "kernels/parallel.h"
#include "scorers/ecokv.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ecokv {

namespace {

// Average ranks (1-based), ties sharing the mean of their positions.
std::vector<double> ranks(const std::vector<double> & x) {
    std::vector<size_t> order(x.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] < x[b]; });
    std::vector<double> r(x.size());
    for (size_t i = 0; i < order.size();) {
        size_t j = i;
        while (j + 1 < order.size() && x[order[j + 1]] == x[order[i]]) {
            ++j;
        }
        for (size_t k = i; k <= j; ++k) {
            r[order[k]] = 0.5 * double(i + j) + 1.0;
        }
        i = j + 1;
    }
    return r;
}

// Pairwise cosines of up to o.max_pair_keys evenly spaced keys of one head.
void pairwise(const head_view & h, const analysis_options & o, head_analysis & out) {
    const int32_t n = std::min(h.n_tokens, o.max_pair_keys), d = int32_t(h.keys.ne[0]);
    std::vector<double> unit(size_t(n) * size_t(d));
    std::vector<float>  row(static_cast<size_t>(d));
    for (int32_t i = 0; i < n; ++i) {
        const int64_t t = int64_t(i) * h.n_tokens / n;
        const float * k = h.keys.row_f32_view(t, h.slice, row.data());
        double        s = 0;
        for (int32_t x = 0; x < d; ++x) {
            s += double(k[x]) * k[x];
        }
        const double inv = s > 0 ? 1.0 / std::sqrt(s) : 0.0;
        for (int32_t x = 0; x < d; ++x) {
            unit[size_t(i) * d + x] = k[x] * inv;
        }
    }
    std::vector<uint64_t> hist(size_t(o.n_bins), 0);
    std::vector<char>     twin(size_t(n), 0);
    double                sum = 0;
    for (int32_t i = 0; i < n; ++i) {
        for (int32_t j = i + 1; j < n; ++j) {
            const double c = std::inner_product(&unit[size_t(i) * d], &unit[size_t(i) * d] + d, &unit[size_t(j) * d], 0.0);
            sum += c;
            hist[size_t(std::clamp(int32_t((c + 1.0) / 2.0 * o.n_bins), 0, o.n_bins - 1))]++;
            if (c >= o.duplicate_cos) {
                twin[size_t(i)] = twin[size_t(j)] = 1;
            }
        }
    }
    const double pairs = 0.5 * double(n) * double(n - 1);
    out.n_pair_keys    = n;
    out.pair_cos_mean  = n > 1 ? sum / pairs : 0.0;
    out.near_duplicates = double(std::count(twin.begin(), twin.end(), 1)) / double(n);
    out.cos_hist.resize(hist.size());
    for (size_t b = 0; b < hist.size(); ++b) {
        out.cos_hist[b] = n > 1 ? double(hist[b]) / pairs : 0.0;
    }
}

}  // namespace

double spearman(const std::vector<double> & x, const std::vector<double> & y) {
    if (x.size() != y.size() || x.size() < 2) {
        throw error("spearman: expected two series of the same length, at least 2");
    }
    const std::vector<double> rx = ranks(x), ry = ranks(y);
    const double              m  = 0.5 * double(x.size() + 1);  // the mean rank of either side
    double                    sxy = 0, sxx = 0, syy = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        sxy += (rx[i] - m) * (ry[i] - m);
        sxx += (rx[i] - m) * (rx[i] - m);
        syy += (ry[i] - m) * (ry[i] - m);
    }
    return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : 0.0;
}

capture_analysis analyze(const capture_view & cap, const method_spec & spec, const method_params & params,
                         const analysis_options & o) {
    if (!cap.heads.empty()) {
        throw error("analyze: the capture's heads hold different tokens (a chunked prefill); analyze a whole prompt");
    }
    if (o.n_bins < 1 || o.max_pair_keys < 2 || o.n_recent < 1) {
        throw error("analyze: n_bins, max_pair_keys and n_recent must be at least 1, 2 and 1");
    }
    capture_analysis out;
    out.sel = compress(cap, spec, params, { o.n_threads });  // validates the capture, the params and finiteness

    const int32_t n_window = method_window(spec, params);
    if (n_window > cap.n_queries) {  // compress() checks it only for the methods that read window queries
        throw error("analyze: the window of " + std::to_string(n_window) + " needs as many captured queries; the "
                    "capture holds " + std::to_string(cap.n_queries));
    }
    if (cap.n_tokens <= n_window + 1) {
        throw error("analyze: the prompt has " + std::to_string(cap.n_tokens) + " tokens; at least " +
                    std::to_string(n_window + 2) + " are needed to rank the prefix before the window of " +
                    std::to_string(n_window));
    }
    out.heads.resize(size_t(cap.n_layers) * size_t(cap.n_kv_heads));
    kernels::parallel_for(int64_t(out.heads.size()), o.n_threads, [&](int64_t i) {
        head_analysis & h = out.heads[size_t(i)];
        h.layer           = int32_t(i / cap.n_kv_heads);
        h.kv_head         = int32_t(i % cap.n_kv_heads);
        pairwise(cap.head(h.layer, h.kv_head), o, h);
        head_stats st;
        st.attn_raw.resize(size_t(cap.n_tokens - n_window));
        kernels::window_attention(cap, h.layer, h.kv_head, n_window, st.attn_raw);
        st.measured                     = true;
        const scorers::ecokv_terms t    = scorers::ecokv_terms_of({ cap, params, h.layer, h.kv_head, n_window, st });
        h.r_c                           = t.r_c;
        h.mean_dist                     = t.mean_dist;
        h.r_e                           = t.r_e;
        h.lambda                        = t.lambda;
        h.spearman                      = spearman(t.simp, t.sdiv);
    });

    out.kept_share.assign(size_t(cap.n_tokens), 0.0);
    out.kept_share_by_layer.assign(out.sel.layers.size(), std::vector<double>(size_t(cap.n_tokens), 0.0));
    for (size_t il = 0; il < out.sel.layers.size(); ++il) {
        const double per_head = 1.0 / double(out.sel.layers[il].size());
        for (const head_selection & hs : out.sel.layers[il]) {
            for (int32_t t : hs.kept) {
                out.kept_share_by_layer[il][size_t(t)] += per_head;
                out.kept_share[size_t(t)] += per_head / double(out.sel.layers.size());
            }
        }
    }
    const int32_t n_recent = std::min(o.n_recent, cap.n_tokens);
    out.recent_kept.assign(out.kept_share.end() - n_recent, out.kept_share.end());
    return out;
}

}  // namespace ecokv
