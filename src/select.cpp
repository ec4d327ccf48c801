#include "select.h"

#include "impl.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ecokv {

namespace {

// Moves the best `k` of `idx` (score descending, index ascending; `rank` first when given) to its front.
void top_k(std::vector<int32_t> & idx, size_t k, std::span<const double> scores, const std::vector<int8_t> * rank) {
    k = std::min(k, idx.size());
    std::nth_element(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        if (rank != nullptr && (*rank)[a] != (*rank)[b]) {
            return (*rank)[a] > (*rank)[b];
        }
        return scores[a] != scores[b] ? scores[a] > scores[b] : a < b;
    });
    idx.resize(k);
}

}  // namespace

std::vector<int32_t> select_head(std::span<const double> scores, const head_budget & budget, const head_view & head) {
    const int32_t n_prefix = int32_t(scores.size());
    ECOKV_ASSERT(budget.prefix >= 0 && budget.prefix <= n_prefix);
    for (int32_t j = 0; j < n_prefix; ++j) {
        if (!std::isfinite(scores[j])) {
            ECOKV_THROW("score of token %d is not finite (degenerate capture?)", j);
        }
    }
    std::vector<int32_t> kept;
    if (budget.image < 0) {
        std::vector<int8_t> text_rank;
        if (budget.text_first) {
            for (int32_t j = 0; j < n_prefix; ++j) {
                text_rank.push_back(head.is_text(j) ? 1 : 0);
            }
        }
        kept.resize(size_t(n_prefix));
        std::iota(kept.begin(), kept.end(), 0);
        top_k(kept, size_t(budget.prefix), scores, budget.text_first ? &text_rank : nullptr);
    } else {
        std::vector<int32_t> text, other;
        for (int32_t j = 0; j < n_prefix; ++j) {
            (head.is_text(j) ? text : other).push_back(j);
        }
        // Each modality takes its share; what one cannot use (too few tokens) goes to the other.
        int32_t take_other = std::min<int32_t>(std::min(budget.image, budget.prefix), int32_t(other.size()));
        int32_t take_text  = std::min<int32_t>(budget.prefix - take_other, int32_t(text.size()));
        take_other         = std::min<int32_t>(budget.prefix - take_text, int32_t(other.size()));
        top_k(text, size_t(take_text), scores, nullptr);
        top_k(other, size_t(take_other), scores, nullptr);
        kept = std::move(text);
        kept.insert(kept.end(), other.begin(), other.end());
    }
    for (int32_t t = n_prefix; t < head.n_tokens; ++t) {
        kept.push_back(t);
    }
    std::sort(kept.begin(), kept.end());
    return kept;
}

void merge_pivot(const capture_view & cap, int32_t il, int32_t ig, int32_t n_window, head_selection & sel) {
    const head_view     head   = cap.head(il, ig);
    const tensor_view & keys   = head.keys;
    const tensor_view & values = head.values;
    const int32_t       d = cap.head_dim, dv = cap.head_dim_v;
    const size_t        n_kept = sel.kept.size();

    sel.keys.resize(n_kept * d);
    sel.values.resize(n_kept * dv);
    std::vector<double> unit(n_kept * d);  // normalised kept keys
    for (size_t p = 0; p < n_kept; ++p) {
        keys.row_f32(sel.kept[p], head.slice, sel.keys.data() + p * d);
        values.row_f32(sel.kept[p], head.slice, sel.values.data() + p * dv);
        double n2 = 0;
        for (int32_t i = 0; i < d; ++i) {
            n2 += double(sel.keys[p * d + i]) * sel.keys[p * d + i];
        }
        const double inv = 1.0 / std::max(std::sqrt(n2), 1e-12);
        for (int32_t i = 0; i < d; ++i) {
            unit[p * d + i] = sel.keys[p * d + i] * inv;
        }
    }
    // Sums of the merged contributions, starting with the pivot itself (scatter_reduce mean, include_self).
    std::vector<double> sum_k(sel.keys.begin(), sel.keys.end()), sum_v(sel.values.begin(), sel.values.end());
    std::vector<int32_t> count(n_kept, 1);
    std::vector<float>   k(static_cast<size_t>(d)), v(static_cast<size_t>(dv));
    size_t               next = 0;
    for (int32_t e = 0; e < head.n_tokens - n_window; ++e) {
        while (next < n_kept && sel.kept[next] < e) {
            ++next;
        }
        if (next < n_kept && sel.kept[next] == e) {
            continue;  // kept, not merged
        }
        keys.row_f32(e, head.slice, k.data());
        values.row_f32(e, head.slice, v.data());
        size_t best = 0;
        double best_dot = -INFINITY;
        for (size_t p = 0; p < n_kept; ++p) {  // the norm of k_e does not change the argmax
            double dot = 0;
            for (int32_t i = 0; i < d; ++i) {
                dot += k[i] * unit[p * d + i];
            }
            if (dot > best_dot) {
                best_dot = dot;
                best     = p;
            }
        }
        for (int32_t i = 0; i < d; ++i) {
            sum_k[best * d + i] += (double(k[i]) + sel.keys[best * d + i]) / 2;
        }
        for (int32_t i = 0; i < dv; ++i) {
            sum_v[best * dv + i] += (double(v[i]) + sel.values[best * dv + i]) / 2;
        }
        ++count[best];
    }
    for (size_t p = 0; p < n_kept; ++p) {
        for (int32_t i = 0; i < d; ++i) {
            sel.keys[p * d + i] = float(sum_k[p * d + i] / count[p]);
        }
        for (int32_t i = 0; i < dv; ++i) {
            sel.values[p * dv + i] = float(sum_v[p * dv + i] / count[p]);
        }
    }
}

}  // namespace ecokv
