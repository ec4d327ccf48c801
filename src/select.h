// ecokv internals: SPEC §2 selection of one (layer, KV head) and the LOOK-M pivot merge.
#pragma once

#include "ecokv/capture.h"
#include "ecokv/compress.h"

#include <cstdint>
#include <span>
#include <vector>

namespace ecokv {

struct head_budget {
    int32_t prefix;           // C: prefix tokens to keep, already capped at |P|
    int32_t image = -1;       // MadaKV: part of C for non-text tokens; -1 means no modality split
    bool    text_first = false;  // LOOK-M: text tokens rank before image tokens
};

// Top-C prefix tokens of the head by score (ties: lower index), plus its window [T - N, T); ascending indices.
std::vector<int32_t> select_head(std::span<const double> scores, const head_budget & budget, const head_view & head);

// LOOK-M pivot merge: every evicted prefix token of the head is averaged into its most cosine-similar kept
// key (keys and values, with the same pivot). Fills sel.keys / sel.values for the kept rows.
void merge_pivot(const capture_view & cap, int32_t il, int32_t ig, int32_t n_window, head_selection & sel);

}  // namespace ecokv
