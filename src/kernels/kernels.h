// ecokv internals: the shared math of every method. Method files stay at the level of SPEC's formulas;
// the loops over tokens and head dimensions live here, once.
#pragma once

#include "ecokv/capture.h"
#include "ecokv/method.h"

#include <cstdint>
#include <span>
#include <vector>

namespace ecokv::kernels {

// a0 of SPEC §3.1 for KV head ig of layer il: softmax(q k / sqrt(D)) of the last n_window queries of
// every query head of the group (causal inside the window), averaged over window queries, then over the
// group. Writes |P| = n_tokens - n_window values.
void window_attention(const capture_view & cap, int32_t il, int32_t ig, int32_t n_window, std::span<float> out);

// SPEC §3.4: causal attention of all prompt queries summed over queries, averaged over the group. Needs
// cap.has_full_queries(). Writes out.size() (<= n_tokens) leading values.
void accumulated_attention(const capture_view & cap, int32_t il, int32_t ig, std::span<float> out);

// 1-D pooling along tokens, stride 1, odd kernel: avg with zero padding counted in the divisor
// (avg_pool1d count_include_pad=True) or max over the in-range neighbours.
std::vector<double> pool(std::span<const float> x, int32_t kernel, pool_kind kind);

// ||row t of slice `slice`|| for t in [0, n_rows).
std::vector<double> row_norms(const tensor_view & rows, int32_t slice, int32_t n_rows);

// Key geometry of one head (SPEC §4), centroids over the first n_centroid tokens (n_tokens or |P|).
struct key_geometry {
    std::vector<double> cos_mu;     // [n_prefix] c[j] = kh[j] . mu
    std::vector<double> dist;       // [n_prefix] dE[j] = ||k[j] - kbar||
    double              mean_dist;  // DE: mean of ||k - kbar|| over the centroid tokens
    double              rc;         // (n ||mu||^2 - 1) / (n - 1): mean pairwise cosine of distinct keys
};
key_geometry compute_key_geometry(const tensor_view & keys, int32_t slice, int32_t n_centroid, int32_t n_prefix);

// SPEC §1 normalisations over P.
std::vector<double> minmax(std::span<const double> x);   // (x - min) / (max - min + 1e-8)
std::vector<double> minmax0(std::span<const double> x);  // no eps; a constant vector maps to zeros
// x * mean(a) / (mean(x) + 1e-8), in place.
void rescale(std::vector<double> & x, std::span<const double> a);

// Round half to even (torch.round, numpy.rint).
double rint_even(double x);

}  // namespace ecokv::kernels
