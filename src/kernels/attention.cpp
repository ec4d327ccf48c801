// Window and accumulated attention: the O(T * D * G * N) hot loop of every attention-based method.
#include "fast-exp.h"
#include "impl.h"
#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace ecokv::kernels {

namespace {

constexpr int32_t k_block = 4;  // keys per dot-product micro-kernel: four accumulators, one query read

// Row t of head ig as floats: a direct pointer for aligned F32 data, else converted into `scratch`.
const float * key_row(const tensor_view & v, int64_t t, int64_t ig, float * scratch) {
    const void * p = v.row(t, ig);
    if (v.type == dtype::f32 && reinterpret_cast<uintptr_t>(p) % alignof(float) == 0) {
        return static_cast<const float *>(p);
    }
    v.row_f32(t, ig, scratch);
    return scratch;
}

// logits[r][t] = q[r] . k[t] for rows r of `q` ([n_rows][D], already scaled) and keys t in [0, n_keys).
void dot_rows(const tensor_view & keys, int32_t ig, int32_t n_keys, const std::vector<float> & q, int32_t n_rows,
              int32_t d, std::vector<float> & logits) {
    std::vector<float> scratch(size_t(k_block) * d);
    const float *      k[k_block];
    int32_t            t = 0;
    for (; t + k_block <= n_keys; t += k_block) {
        for (int32_t b = 0; b < k_block; ++b) {
            k[b] = key_row(keys, t + b, ig, scratch.data() + size_t(b) * d);
        }
        for (int32_t r = 0; r < n_rows; ++r) {
            const float * qr = q.data() + size_t(r) * d;
            float         s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (int32_t i = 0; i < d; ++i) {
                s0 += qr[i] * k[0][i];
                s1 += qr[i] * k[1][i];
                s2 += qr[i] * k[2][i];
                s3 += qr[i] * k[3][i];
            }
            float * out = logits.data() + size_t(r) * n_keys + t;
            out[0]      = s0;
            out[1]      = s1;
            out[2]      = s2;
            out[3]      = s3;
        }
    }
    for (; t < n_keys; ++t) {
        const float * kt = key_row(keys, t, ig, scratch.data());
        for (int32_t r = 0; r < n_rows; ++r) {
            const float * qr = q.data() + size_t(r) * d;
            float         s  = 0;
#pragma omp simd reduction(+ : s)
            for (int32_t i = 0; i < d; ++i) {
                s += qr[i] * kt[i];
            }
            logits[size_t(r) * n_keys + t] = s;
        }
    }
}

// In place: row[0..n) <- softmax(row[0..n)); returns nothing, the row sums to one.
void softmax(float * row, int32_t n) {
    float mx = row[0];
    for (int32_t j = 1; j < n; ++j) {
        mx = std::max(mx, row[j]);
    }
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int32_t j = 0; j < n; ++j) {
        const float e = fast_exp(row[j] - mx);
        row[j]        = e;
        sum += e;
    }
    const float inv = float(1.0 / sum);
#pragma omp simd
    for (int32_t j = 0; j < n; ++j) {
        row[j] *= inv;
    }
}

// Queries rows [first, first + n) of every head of group ig, scaled by 1/sqrt(D): [G * n][D].
std::vector<float> group_queries(const capture_view & cap, const tensor_view & q, int32_t ig, int32_t first,
                                 int32_t n) {
    const int32_t      g = cap.n_heads / cap.n_kv_heads;
    const int32_t      d = cap.head_dim;
    const float        scale = float(1.0 / std::sqrt(double(d)));
    std::vector<float> out(size_t(g) * n * d);
    for (int32_t h = 0; h < g; ++h) {
        for (int32_t i = 0; i < n; ++i) {
            float * dst = out.data() + (size_t(h) * n + i) * d;
            q.row_f32(first + i, int64_t(ig) * g + h, dst);
            for (int32_t x = 0; x < d; ++x) {
                dst[x] *= scale;
            }
        }
    }
    return out;
}

}  // namespace

void window_attention(const capture_view & cap, int32_t il, int32_t ig, int32_t n_window, std::span<float> out) {
    const int32_t t_all    = cap.n_tokens;
    const int32_t n_prefix = t_all - n_window;
    const int32_t g        = cap.n_heads / cap.n_kv_heads;
    ECOKV_ASSERT(n_window >= 1 && n_window <= cap.n_queries && int32_t(out.size()) == n_prefix);

    const layer_capture & lc     = cap.layers[il];
    const int32_t         n_rows = g * n_window;
    std::vector<float>    q      = group_queries(cap, lc.queries, ig, cap.n_queries - n_window, n_window);
    std::vector<float>    logits(size_t(n_rows) * t_all);
    dot_rows(lc.keys, ig, t_all, q, n_rows, cap.head_dim, logits);

    std::vector<float> acc(size_t(n_prefix), 0.0f);
    for (int32_t r = 0; r < n_rows; ++r) {
        const int32_t i   = r % n_window;           // window query i sits at token n_prefix + i
        float *       row = logits.data() + size_t(r) * t_all;
        softmax(row, n_prefix + i + 1);            // causal: keys j <= n_prefix + i
#pragma omp simd
        for (int32_t j = 0; j < n_prefix; ++j) {
            acc[j] += row[j];
        }
    }
    const float inv = 1.0f / float(n_rows);  // mean over window queries, then over the group's heads
    for (int32_t j = 0; j < n_prefix; ++j) {
        out[j] = acc[j] * inv;
    }
}

void accumulated_attention(const capture_view & cap, int32_t il, int32_t ig, std::span<float> out) {
    ECOKV_ASSERT(cap.has_full_queries() && int32_t(out.size()) <= cap.n_tokens);
    const int32_t         t_all = cap.n_tokens;
    const int32_t         g     = cap.n_heads / cap.n_kv_heads;
    const layer_capture & lc    = cap.layers[il];
    std::vector<double>   acc(out.size(), 0.0);
    // One query chunk at a time keeps the logits buffer at chunk x T.
    constexpr int32_t chunk = 64;
    for (int32_t first = 0; first < t_all; first += chunk) {
        const int32_t      n      = std::min(chunk, t_all - first);
        std::vector<float> q      = group_queries(cap, lc.full_queries, ig, first, n);
        const int32_t      n_keys = first + n;  // later keys are masked for every query of the chunk
        std::vector<float> logits(size_t(g) * n * n_keys);
        dot_rows(lc.keys, ig, n_keys, q, g * n, cap.head_dim, logits);
        for (int32_t r = 0; r < g * n; ++r) {
            const int32_t i   = first + r % n;
            float *       row = logits.data() + size_t(r) * n_keys;
            softmax(row, i + 1);
            const int32_t m = std::min<int32_t>(i + 1, int32_t(out.size()));
            for (int32_t j = 0; j < m; ++j) {
                acc[j] += row[j];
            }
        }
    }
    for (size_t j = 0; j < out.size(); ++j) {
        out[j] = float(acc[j] / g);
    }
}

}  // namespace ecokv::kernels
