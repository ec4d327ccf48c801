// Test support shared by the tests of the session API (test-session.cpp, test-quantized-kv.cpp): llama.cpp's log
// silenced, method budgets, and what a query sees after a compression.
#pragma once

#include "ecokv/llama-session.h"
#include "tiny-model.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace ecokv::test {

// llama.cpp's log only for errors.
inline const bool quiet_llama = [] {
    ecokv::llama::set_verbose(false);
    return true;
}();

inline ecokv::method_params budget(int32_t b, int32_t w = -1) {
    ecokv::method_params p;
    p.budget = b;
    p.window = w;
    return p;
}

// Visible keys after a compression of the first n_prompt tokens: what each (layer, KV head) kept (`kept`, indexed
// layer * n_kv + head, as sequence::kept_cells), then every later token. With `swa` (an iSWA model), `kept` holds the
// compressed layers only: a sliding-window layer keeps llama.cpp's window, which the reference masks itself.
inline keep_fn kept_mask(const std::vector<std::vector<int32_t>> & kept, int32_t n_kv, int32_t n_prompt,
                         const tiny_model * swa = nullptr) {
    std::vector<int32_t> layer_of;  // model layer -> compressed layer, -1 for a sliding-window one
    for (int32_t il = 0, i = 0; swa && il < swa->config().n_layer; ++il) {
        layer_of.push_back(swa->is_swa(il) ? -1 : i++);
    }
    return [&kept, n_kv, n_prompt, layer_of](int32_t il, int32_t g, int32_t qi, int32_t kj) {
        const int32_t layer = layer_of.empty() ? il : layer_of[size_t(il)];
        if (qi < n_prompt || kj >= n_prompt || layer < 0) {
            return true;
        }
        const auto & h = kept[size_t(layer) * n_kv + g];
        return std::binary_search(h.begin(), h.end(), kj);
    };
}

}  // namespace ecokv::test
