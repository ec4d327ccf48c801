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

constexpr int32_t k_keys = 16;  // keys per block: the vector lanes of the micro-kernel
constexpr int32_t k_rows = 4;   // query rows per micro-kernel: accumulators kept in registers

// Block of keys [t0, t0 + k_keys) transposed to kt[i][j] = k[t0 + j][i], zero beyond n_keys.
void load_block(const tensor_view & keys, int32_t ig, int32_t t0, int32_t n_keys, int32_t d, float * row,
                float * kt) {
    for (int32_t j = 0; j < k_keys; ++j) {
        if (t0 + j < n_keys) {
            keys.row_f32(t0 + j, ig, row);
        } else {
            std::fill(row, row + d, 0.0f);
        }
        for (int32_t i = 0; i < d; ++i) {
            kt[size_t(i) * k_keys + j] = row[i];
        }
    }
}

// out[r][j] = q[r] . kt[:, j] for R rows: the lanes run over keys, so no horizontal sums are needed.
template <int32_t R> void micro_kernel(const float * q, int32_t d, const float * kt, float * out, size_t out_stride) {
    float acc[R][k_keys] = {};
    for (int32_t i = 0; i < d; ++i) {
        const float * k = kt + size_t(i) * k_keys;
        for (int32_t r = 0; r < R; ++r) {
            const float qv = q[size_t(r) * d + i];
#pragma omp simd
            for (int32_t j = 0; j < k_keys; ++j) {
                acc[r][j] += qv * k[j];
            }
        }
    }
    for (int32_t r = 0; r < R; ++r) {
        std::copy(acc[r], acc[r] + k_keys, out + r * out_stride);
    }
}

// logits[r][t] = q[r] . k[t] for rows r of `q` ([n_rows][D], already scaled) and keys t in [0, n_keys).
// `logits` rows have a stride of n_keys rounded up to k_keys.
void dot_rows(const tensor_view & keys, int32_t ig, int32_t n_keys, const std::vector<float> & q, int32_t n_rows,
              int32_t d, std::vector<float> & logits, size_t stride) {
    std::vector<float> row(static_cast<size_t>(d)), kt(size_t(d) * k_keys);
    for (int32_t t0 = 0; t0 < n_keys; t0 += k_keys) {
        load_block(keys, ig, t0, n_keys, d, row.data(), kt.data());
        int32_t r = 0;
        for (; r + k_rows <= n_rows; r += k_rows) {
            micro_kernel<k_rows>(q.data() + size_t(r) * d, d, kt.data(), logits.data() + r * stride + t0, stride);
        }
        for (; r < n_rows; ++r) {
            micro_kernel<1>(q.data() + size_t(r) * d, d, kt.data(), logits.data() + r * stride + t0, stride);
        }
    }
}

size_t padded(int32_t n) { return (size_t(n) + k_keys - 1) / k_keys * k_keys; }

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
    const size_t          stride = padded(t_all);
    std::vector<float>    logits(size_t(n_rows) * stride);
    dot_rows(lc.keys, ig, t_all, q, n_rows, cap.head_dim, logits, stride);

    std::vector<float> acc(size_t(n_prefix), 0.0f);
    for (int32_t r = 0; r < n_rows; ++r) {
        const int32_t i   = r % n_window;           // window query i sits at token n_prefix + i
        float *       row = logits.data() + size_t(r) * stride;
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
        const size_t       stride = padded(n_keys);
        std::vector<float> logits(size_t(g) * n * stride);
        dot_rows(lc.keys, ig, n_keys, q, g * n, cap.head_dim, logits, stride);
        for (int32_t r = 0; r < g * n; ++r) {
            const int32_t i   = first + r % n;
            float *       row = logits.data() + size_t(r) * stride;
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
