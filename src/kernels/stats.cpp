// Per-token statistics over one head: pooling, norms, key geometry and the SPEC §1 normalisations.
#include "impl.h"
#include "kernels.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ecokv::kernels {

std::vector<double> pool(std::span<const float> x, int32_t kernel, pool_kind kind) {
    const int32_t n    = int32_t(x.size());
    const int32_t half = kernel / 2;
    std::vector<double> out(static_cast<size_t>(n));
    if (kind == pool_kind::avg) {
        std::vector<double> prefix(size_t(n) + 1, 0.0);  // prefix sums: O(n) for any kernel
        for (int32_t j = 0; j < n; ++j) {
            prefix[j + 1] = prefix[j] + double(x[j]);
        }
        for (int32_t j = 0; j < n; ++j) {
            const int32_t lo = std::max(0, j - half);
            const int32_t hi = std::min(n, j + half + 1);
            out[j]           = (prefix[hi] - prefix[lo]) / double(kernel);
        }
    } else {
        for (int32_t j = 0; j < n; ++j) {
            const int32_t lo = std::max(0, j - half);
            const int32_t hi = std::min(n, j + half + 1);
            out[j]           = double(*std::max_element(x.begin() + lo, x.begin() + hi));
        }
    }
    return out;
}

namespace {

ECOKV_SIMD_INLINE float sum_squares(const float * x, int32_t n) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int32_t i = 0; i < n; ++i) {
        s += x[i] * x[i];
    }
    return s;
}

}  // namespace

ECOKV_SIMD_DISPATCH std::vector<double> row_norms(const tensor_view & rows, int32_t ig, int32_t n_rows) {
    std::vector<double> out(static_cast<size_t>(n_rows));
    std::vector<float>  row(static_cast<size_t>(rows.ne[0]));
    for (int32_t t = 0; t < n_rows; ++t) {
        out[t] = std::sqrt(double(sum_squares(rows.row_f32_view(t, ig, row.data()), int32_t(row.size()))));
    }
    return out;
}

// Two passes over the keys in fp32 SIMD: (1) norms and the centroids mu, kbar, summed in fp32 blocks of
// k_block rows and carried in fp64; (2) c[j] and dE[j] against the fp32 centroids.
ECOKV_SIMD_DISPATCH key_geometry compute_key_geometry(const tensor_view & keys, int32_t ig, int32_t n_centroid,
                                                      int32_t n_prefix) {
    constexpr int32_t   k_block = 64;
    const int32_t       d       = int32_t(keys.ne[0]);
    const int32_t       n_rows  = std::max(n_centroid, n_prefix);
    std::vector<float>  row(static_cast<size_t>(d)), mu_blk(static_cast<size_t>(d)), kbar_blk(static_cast<size_t>(d));
    std::vector<double> norm(static_cast<size_t>(n_rows)), mu(static_cast<size_t>(d)), kbar(static_cast<size_t>(d));
    for (int32_t t = 0; t < n_rows; ++t) {
        const float * k = keys.row_f32_view(t, ig, row.data());
        norm[t]         = std::sqrt(double(sum_squares(k, d)));
        if (t < n_centroid) {
            const float inv = float(1.0 / std::max(norm[t], 1e-12));
#pragma omp simd
            for (int32_t i = 0; i < d; ++i) {
                mu_blk[i] += k[i] * inv;
                kbar_blk[i] += k[i];
            }
        }
        if ((t + 1) % k_block == 0 || t + 1 == n_rows) {
            for (int32_t i = 0; i < d; ++i) {
                mu[i] += mu_blk[i];
                kbar[i] += kbar_blk[i];
            }
            std::fill(mu_blk.begin(), mu_blk.end(), 0.0f);
            std::fill(kbar_blk.begin(), kbar_blk.end(), 0.0f);
        }
    }
    std::vector<float> mu_f(static_cast<size_t>(d)), kbar_f(static_cast<size_t>(d));
    for (int32_t i = 0; i < d; ++i) {
        mu[i] /= n_centroid;
        kbar[i] /= n_centroid;
        mu_f[i]   = float(mu[i]);
        kbar_f[i] = float(kbar[i]);
    }
    key_geometry g;
    g.cos_mu.resize(static_cast<size_t>(n_prefix));
    g.dist.resize(static_cast<size_t>(n_prefix));
    double sum_dist = 0;
    for (int32_t t = 0; t < n_rows; ++t) {
        const float * k   = keys.row_f32_view(t, ig, row.data());
        float         dot = 0, dist2 = 0;
#pragma omp simd reduction(+ : dot, dist2)
        for (int32_t i = 0; i < d; ++i) {
            dot += k[i] * mu_f[i];
            const float diff = k[i] - kbar_f[i];
            dist2 += diff * diff;
        }
        const double dist = std::sqrt(double(dist2));
        if (t < n_prefix) {
            g.cos_mu[t] = double(dot) / std::max(norm[t], 1e-12);
            g.dist[t]   = dist;
        }
        if (t < n_centroid) {
            sum_dist += dist;
        }
    }
    const double mu2 = std::inner_product(mu.begin(), mu.end(), mu.begin(), 0.0);
    g.mean_dist      = sum_dist / n_centroid;
    g.rc             = n_centroid > 1 ? (n_centroid * mu2 - 1.0) / (n_centroid - 1.0) : 1.0;
    return g;
}

std::vector<double> minmax(std::span<const double> x) {
    const auto [lo, hi] = std::minmax_element(x.begin(), x.end());
    std::vector<double> out(x.size());
    for (size_t j = 0; j < x.size(); ++j) {
        out[j] = (x[j] - *lo) / (*hi - *lo + 1e-8);
    }
    return out;
}

std::vector<double> minmax0(std::span<const double> x) {
    const auto [lo, hi] = std::minmax_element(x.begin(), x.end());
    std::vector<double> out(x.size(), 0.0);
    if (*hi > *lo) {
        for (size_t j = 0; j < x.size(); ++j) {
            out[j] = (x[j] - *lo) / (*hi - *lo);
        }
    }
    return out;
}

void rescale(std::vector<double> & x, std::span<const double> a) {
    const double mean_x = std::accumulate(x.begin(), x.end(), 0.0) / double(x.size());
    const double mean_a = std::accumulate(a.begin(), a.end(), 0.0) / double(a.size());
    const double factor = mean_a / (mean_x + 1e-8);
    for (double & v : x) {
        v *= factor;
    }
}

double rint_even(double x) {
    return std::nearbyint(x);  // the default rounding mode is round-half-to-even
}

}  // namespace ecokv::kernels
