// Window and accumulated attention: the O(T * D * rows) hot loop of every attention-based method.
//
// Layout: query rows are transposed into tiles of k_lanes rows (qt[i][lane]), so the vector lanes run over
// query rows. Each key is broadcast from its own contiguous row (no key transpose, F16 converted per row),
// and softmax runs with the lanes over rows too. Only the final per-key sum over rows is horizontal.
#include "fast-exp.h"
#include "impl.h"
#include "kernels.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace ecokv::kernels {

namespace {

constexpr int32_t k_lanes = 32;  // query rows per tile
constexpr int32_t k_keys  = 8;   // keys per micro-kernel step: 8 x 32 accumulators (AVX-512: 16 of 32 registers)

struct row_tiles {
    int32_t            n_rows = 0;
    int32_t            n_tiles = 0;
    std::vector<float> qt;     // [n_tiles][D][k_lanes]  queries scaled by 1/sqrt(D), zero-padded rows
    std::vector<int32_t> last; // [n_tiles * k_lanes]     last key each row may see (causal); -1 for padding
};

// logits[tile][t][lane] = q[row] . k[t] for keys t in [0, n_keys).
template <int32_t K>
ECOKV_SIMD_INLINE void dot_step(const float * const * k, const row_tiles & rows, int32_t d, int32_t t0, int32_t n_keys,
                                float * logits) {
    for (int32_t tile = 0; tile < rows.n_tiles; ++tile) {
        const float * qt = rows.qt.data() + size_t(tile) * d * k_lanes;
        float         acc[K][k_lanes] = {};
        for (int32_t i = 0; i < d; ++i) {
            const float * q = qt + size_t(i) * k_lanes;
            for (int32_t kk = 0; kk < K; ++kk) {
                const float kv = k[kk][i];
#pragma omp simd
                for (int32_t l = 0; l < k_lanes; ++l) {
                    acc[kk][l] += kv * q[l];
                }
            }
        }
        for (int32_t kk = 0; kk < K; ++kk) {
            std::copy(acc[kk], acc[kk] + k_lanes, logits + (size_t(tile) * n_keys + t0 + kk) * k_lanes);
        }
    }
}

ECOKV_SIMD_DISPATCH void dot_keys(const tensor_view & keys, int32_t ig, int32_t n_keys, const row_tiles & rows,
                                  int32_t d, std::vector<float> & logits) {
    std::vector<float> buf(size_t(k_keys) * d);
    const float *      k[k_keys];
    int32_t            t = 0;
    for (; t + k_keys <= n_keys; t += k_keys) {
        for (int32_t kk = 0; kk < k_keys; ++kk) {
            k[kk] = keys.row_f32_view(t + kk, ig, buf.data() + size_t(kk) * d);
        }
        dot_step<k_keys>(k, rows, d, t, n_keys, logits.data());
    }
    for (; t < n_keys; ++t) {
        k[0] = keys.row_f32_view(t, ig, buf.data());
        dot_step<1>(k, rows, d, t, n_keys, logits.data());
    }
}

// acc[t] += sum over rows of softmax_t(logits of the row, causal) for t < acc.size().
ECOKV_SIMD_DISPATCH void softmax_accumulate(const row_tiles & rows, int32_t n_keys, std::vector<float> & logits,
                                            std::vector<double> & acc) {
    const int32_t n_out = int32_t(acc.size());
    for (int32_t tile = 0; tile < rows.n_tiles; ++tile) {
        float *         lg   = logits.data() + size_t(tile) * n_keys * k_lanes;
        const int32_t * last = rows.last.data() + size_t(tile) * k_lanes;
        int32_t         min_last = n_keys;  // keys every real row of the tile sees need no mask
        for (int32_t l = 0; l < k_lanes; ++l) {
            if (last[l] >= 0) {
                min_last = std::min(min_last, last[l]);
            }
        }
        float mx[k_lanes], sum[k_lanes], inv[k_lanes];
        std::fill(mx, mx + k_lanes, -std::numeric_limits<float>::infinity());
        std::fill(sum, sum + k_lanes, 0.0f);
        for (int32_t t = 0; t < n_keys; ++t) {
            const float * x = lg + size_t(t) * k_lanes;
#pragma omp simd
            for (int32_t l = 0; l < k_lanes; ++l) {
                mx[l] = t <= last[l] ? std::max(mx[l], x[l]) : mx[l];
            }
        }
        for (int32_t t = 0; t < n_keys; ++t) {
            float * x = lg + size_t(t) * k_lanes;
            if (t <= min_last) {
#pragma omp simd
                for (int32_t l = 0; l < k_lanes; ++l) {
                    x[l] = fast_exp(x[l] - mx[l]);
                    sum[l] += x[l];
                }
            } else {
#pragma omp simd
                for (int32_t l = 0; l < k_lanes; ++l) {
                    x[l] = t <= last[l] ? fast_exp(x[l] - mx[l]) : 0.0f;
                    sum[l] += x[l];
                }
            }
        }
        for (int32_t l = 0; l < k_lanes; ++l) {
            inv[l] = last[l] >= 0 ? 1.0f / sum[l] : 0.0f;
        }
        for (int32_t t = 0; t < std::min(n_out, n_keys); ++t) {
            const float * x = lg + size_t(t) * k_lanes;
            float         s = 0;
#pragma omp simd reduction(+ : s)
            for (int32_t l = 0; l < k_lanes; ++l) {
                s += x[l] * inv[l];
            }
            acc[t] += s;
        }
    }
}

// Rows (head h of group ig, captured query `first + i`) for i in [0, n), as tiles; row r's last visible key
// is position_of_first + i.
row_tiles make_tiles(const capture_view & cap, const tensor_view & q, int32_t ig, int32_t first, int32_t n,
                     int32_t position_of_first) {
    const int32_t g = cap.n_heads / cap.n_kv_heads, d = cap.head_dim;
    row_tiles     rows;
    rows.n_rows  = g * n;
    rows.n_tiles = (rows.n_rows + k_lanes - 1) / k_lanes;
    rows.qt.assign(size_t(rows.n_tiles) * d * k_lanes, 0.0f);
    rows.last.assign(size_t(rows.n_tiles) * k_lanes, -1);
    const float        scale = float(1.0 / std::sqrt(double(d)));
    std::vector<float> row(static_cast<size_t>(d));
    for (int32_t h = 0; h < g; ++h) {
        for (int32_t i = 0; i < n; ++i) {
            const int32_t r = h * n + i, tile = r / k_lanes, lane = r % k_lanes;
            q.row_f32(first + i, int64_t(ig) * g + h, row.data());
            for (int32_t x = 0; x < d; ++x) {
                rows.qt[(size_t(tile) * d + x) * k_lanes + lane] = row[x] * scale;
            }
            rows.last[r] = position_of_first + i;
        }
    }
    return rows;
}

// acc[t] += causal attention of the given rows on key t of the head.
void accumulate(const head_view & head, int32_t head_dim, const row_tiles & rows, int32_t n_keys,
                std::vector<double> & acc) {
    std::vector<float> logits(size_t(rows.n_tiles) * n_keys * k_lanes);
    dot_keys(head.keys, int32_t(head.slice), n_keys, rows, head_dim, logits);
    softmax_accumulate(rows, n_keys, logits, acc);
}

}  // namespace

void window_attention(const capture_view & cap, int32_t il, int32_t ig, int32_t n_window, std::span<float> out) {
    const head_view head     = cap.head(il, ig);
    const int32_t   n_prefix = head.n_tokens - n_window;
    ECOKV_ASSERT(n_window >= 1 && n_window <= cap.n_queries && int32_t(out.size()) == n_prefix);
    const row_tiles rows = make_tiles(cap, cap.layers[il].queries, ig, cap.n_queries - n_window, n_window, n_prefix);
    std::vector<double> acc(static_cast<size_t>(n_prefix), 0.0);
    accumulate(head, cap.head_dim, rows, head.n_tokens, acc);
    for (int32_t j = 0; j < n_prefix; ++j) {  // mean over window queries, then over the group's heads
        out[j] = float(acc[j] / rows.n_rows);
    }
}

void accumulated_attention(const capture_view & cap, int32_t il, int32_t ig, std::span<float> out) {
    const head_view     head = cap.head(il, ig);
    const tensor_view & fq   = cap.layers[il].full_queries;
    // The full queries are those of the head's last n_q tokens (all of them, or the new ones of a per-head capture).
    const int32_t n_q = int32_t(fq.ne[1]), first_pos = head.n_tokens - n_q;
    ECOKV_ASSERT(cap.has_full_queries() && int32_t(out.size()) <= head.n_tokens && first_pos >= 0);
    const int32_t       g = cap.n_heads / cap.n_kv_heads;
    std::vector<double> acc(out.size(), 0.0);
    constexpr int32_t   chunk = 64;  // query positions per pass: logits stay at chunk x G x T
    for (int32_t first = 0; first < n_q; first += chunk) {
        const int32_t n = std::min(chunk, n_q - first);
        // Keys after the chunk's last query are masked for all its rows.
        accumulate(head, cap.head_dim, make_tiles(cap, fq, ig, first, n, first_pos + first), first_pos + first + n, acc);
    }
    const std::vector<float> * prior = cap.heads.empty() ? nullptr : &cap.heads[size_t(il) * cap.n_kv_heads + ig].prior_attention;
    for (size_t j = 0; j < out.size(); ++j) {
        out[j] = float(acc[j] / g) + (prior && !prior->empty() ? (*prior)[j] : 0.0f);
    }
}

}  // namespace ecokv::kernels
