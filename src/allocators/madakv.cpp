// MadaKV: "MadaKV: Adaptive Modality-Perception KV Cache Eviction", ACL 2025 (seeds/madakv-summary.txt; no
// public code). SPEC §6, our reading:
// - modality preference: psi = a0 (window attention, unpooled); each head's budget splits into
//   b_img = rint(b w_img / (w_img + w_txt)) and b_txt = b - b_img (select.cpp moves what a modality cannot use);
// - compensation in closed form: demand d_{l,g} = fewest top-psi tokens covering theta of each modality's mass;
//   C_{l,g} = m + rint(pool d_{l,g} / sum d) with m = floor(rho C), pool = L Hkv (C - m), exact rational rounding.
#include "common.h"

#include <algorithm>
#include <cmath>

namespace ecokv::allocators {
namespace {
// Fewest of `psi` (descending) whose running sum reaches theta * sum(psi).
int64_t demand(std::vector<double> psi, double theta) {
    std::sort(psi.begin(), psi.end(), std::greater<>());
    double mass = 0;
    for (double v : psi) {
        mass += v;
    }
    const double target = theta * mass;
    double       run    = 0;
    int64_t      n      = 0;
    while (run < target && n < int64_t(psi.size())) {
        run += psi[size_t(n++)];
    }
    return n;
}

// Round half to even of num / den for non-negative integers, exactly.
int64_t div_rint(int64_t num, int64_t den) {
    const int64_t q = num / den, r = num % den;
    return 2 * r > den || (2 * r == den && (q & 1)) ? q + 1 : q;
}

class madakv final : public allocator_i {
    allocation allocate(const allocator_input & in) const override {
        const int32_t       c = selectable(in);
        const size_t        n = n_heads_total(in);
        std::vector<double> w_img(n, 0.0), w_txt(n, 0.0);
        std::vector<int64_t> d(n, 0);
        for (size_t i = 0; i < n; ++i) {
            std::vector<double> img, txt;
            const auto &        psi  = in.stats[i].attn_raw;
            const head_view     head = in.cap.head(int32_t(i / in.cap.n_kv_heads), int32_t(i % in.cap.n_kv_heads));
            for (int32_t j = 0; j < int32_t(psi.size()); ++j) {
                (head.is_text(j) ? txt : img).push_back(psi[j]);
                (head.is_text(j) ? w_txt[i] : w_img[i]) += psi[j];
            }
            d[i] = demand(img, in.params.theta) + demand(txt, in.params.theta);
        }
        const int64_t m     = int64_t(std::floor(floor_ratio(in, 0.2) * c));
        const int64_t pool  = int64_t(n) * (c - m);
        int64_t       total = 0;
        for (int64_t v : d) {
            total += v;
        }
        allocation out;
        for (size_t i = 0; i < n; ++i) {
            const int64_t b = std::min<int64_t>(m + (total > 0 ? div_rint(pool * d[i], total) : 0),
                                                int64_t(in.stats[i].attn_raw.size()));  // the head's |P|
            const double  w = w_img[i] + w_txt[i];
            out.budget.push_back(int32_t(b));
            out.budget_image.push_back(w > 0 ? int32_t(kernels::rint_even(double(b) * w_img[i] / w)) : 0);
        }
        return out;
    }
};
}  // namespace
allocator_ptr make_madakv() { return std::make_unique<madakv>(); }
}  // namespace ecokv::allocators
