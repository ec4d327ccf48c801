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
// layer * n_kv + head, as sequence::kept_cells), then every later token.
inline keep_fn kept_mask(const std::vector<std::vector<int32_t>> & kept, int32_t n_kv, int32_t n_prompt) {
    return [&kept, n_kv, n_prompt](int32_t il, int32_t g, int32_t qi, int32_t kj) {
        const auto & h = kept[size_t(il) * n_kv + g];
        return qi < n_prompt || kj >= n_prompt || std::binary_search(h.begin(), h.end(), kj);
    };
}

}  // namespace ecokv::test
