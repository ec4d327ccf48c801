// ecokv eval internals: the corpus-level function of each metric, as the registry (registry.cpp) lists them.
#pragma once

#include "ecokv/metrics.h"

#include <span>

namespace ecokv::detail {

// Each takes the already checked items (at least one, each with answers, with a type where the metric needs
// one) and fills score and n, plus correct and by_type for counting metrics. `metric` is left to the caller.
using metric_fn = metric_result (*)(std::span<const metric_item> items);

metric_result score_exact(std::span<const metric_item> items);
metric_result score_relaxed(std::span<const metric_item> items);
metric_result score_vqa(std::span<const metric_item> items);
metric_result score_anls(std::span<const metric_item> items);
metric_result score_chars(std::span<const metric_item> items);
metric_result score_cider(std::span<const metric_item> items);
metric_result score_rougel(std::span<const metric_item> items);
metric_result score_ocrbench(std::span<const metric_item> items);

// Mean of per-item scores, summed in item order as the evaluators' sum(...) / len(...) does.
template <typename F>
metric_result mean_over_items(std::span<const metric_item> items, F && per_item) {
    metric_result r;
    double        sum = 0;
    for (const metric_item & it : items) {
        sum += per_item(it);
    }
    r.n     = items.size();
    r.score = sum / double(items.size());
    return r;
}

}  // namespace ecokv::detail
