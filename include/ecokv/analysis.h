// ecokv: the ECOKV paper's analyses of one capture, for any model and input (`ecokv analyze`):
// - key geometry per (layer, KV head): the distribution of pairwise key cosines (Figure 1), the share of keys with
//   a near-duplicate, and the redundancy terms rC, DE, rE and lambda (Section 5.2, Figures 7-8);
// - the Spearman correlation of ECOKV's importance and diversity over the prefix (Figures 4 and 6);
// - under a method at a budget, how often each token is kept: per token (kept-token maps) and over the last tokens
//   of the prompt (Figure 5).
#pragma once

#include "ecokv/capture.h"
#include "ecokv/compress.h"
#include "ecokv/method.h"

#include <cstdint>
#include <vector>

namespace ecokv {

struct analysis_options {
    int32_t n_bins        = 20;    // pairwise key cosines: bins of width 2 / n_bins over [-1, 1]
    int32_t max_pair_keys = 1024;  // pairwise statistics over at most this many keys per head, evenly spaced
    double  duplicate_cos = 0.95;  // a key with another at this cosine or more has a near-duplicate
    int32_t n_recent      = 32;    // the last prompt tokens whose selection rate is reported (Figure 5)
    int32_t n_threads     = 0;     // 0: all hardware threads
};

// One (layer, KV head), over the head's tokens.
struct head_analysis {
    int32_t             layer = 0, kv_head = 0;
    int32_t             n_pair_keys = 0;        // keys the pairwise statistics were taken over
    std::vector<double> cos_hist;               // share of distinct key pairs in each cosine bin
    double              pair_cos_mean   = 0;    // mean cosine of those pairs
    double              near_duplicates = 0;    // share of those keys with another at duplicate_cos or more
    double              r_c = 0, mean_dist = 0, r_e = 0, lambda = 0;  // ECOKV's redundancy terms at the params
    double              spearman = 0;           // rank correlation of ECOKV's S_imp and S_div over the prefix
};

struct capture_analysis {
    std::vector<head_analysis> heads;        // [n_layers * n_kv_heads], layer-major
    selection                  sel;          // the method at the params' budget
    std::vector<double>        kept_share;   // [n_tokens] share of (layer, KV head)s keeping each token
    std::vector<std::vector<double>> kept_share_by_layer;  // [n_layers][n_tokens] share of the layer's KV heads
    std::vector<double>        recent_kept;  // [min(n_recent, n_tokens)] the same for the last tokens, oldest first
};

// The window of the importance term is the method's (method_window). Throws ecokv::error as compress() does, and
// for a capture with per-head token sets (a chunked prefill's) or a prompt not longer than the window.
capture_analysis analyze(const capture_view & cap, const method_spec & spec, const method_params & params,
                         const analysis_options & options = {});

// Spearman's rank correlation (average ranks for ties); 0 when either side is constant. Same sizes, at least 2.
double spearman(const std::vector<double> & x, const std::vector<double> & y);

}  // namespace ecokv
