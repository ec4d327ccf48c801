// exact: exact match after strip() and lower() of both strings, 1 if any answer matches; mean over items.
//
// The plain normalised exact match that lmms-eval and most VQA-style harnesses report as "exact_match" when a
// benchmark has no evaluator of its own. Deviation: lower() is text.h's (no final sigma).
#include "metric-impl.h"
#include "metrics/text.h"

namespace ecokv {

double metrics::exact_match(std::string_view prediction, std::span<const std::string> answers) {
    using namespace detail;
    const std::u32string pred = py_lower(py_strip(utf8_decode(prediction)));
    for (const std::string & a : answers) {
        if (py_lower(py_strip(utf8_decode(a))) == pred) {
            return 1.0;
        }
    }
    return 0.0;
}

metric_result detail::score_exact(std::span<const metric_item> items) {
    return mean_over_items(items,
                           [](const metric_item & it) { return metrics::exact_match(it.prediction, it.answers); });
}

}  // namespace ecokv
