// anls: Average Normalized Levenshtein Similarity (Biten et al., ICCV 2019, arXiv:1905.13648), as DocVQA
// (Mathew et al., WACV 2021, arXiv:2007.00398) and InfographicVQA score it.
//
// Reproduces the official RRC evaluation script (Qwen-VL eval_mm/infographicsvqa_eval.py, and anls() in
// lmms-eval lmms_eval/api/metrics.py, which cites it). For each answer:
//   gt  = ' '.join(answer.strip().lower().split());  det = ' '.join(pred.strip().lower().split())
//   NL  = levenshtein(gt, det) / max(len(answer.upper()), len(pred.upper()))   (0 when both are empty)
// then question_result = 1 - min(NL) and question_result = 0 when it is below 0.5. Two details follow the code
// rather than the paper: the lengths are those of the raw strings (before strip and whitespace collapsing), and
// NL = 0.5 exactly scores 0.5 (the paper zeroes NL >= 0.5, the script zeroes 1 - NL < 0.5).
// Deviations: len(x.upper()) is counted as len(x), which differs only for characters whose upper case is longer
// (German sharp s, ligatures); lower() is text.h's.
#include "metric-impl.h"
#include "metrics/text.h"

#include <algorithm>

namespace ecokv {

namespace {

using namespace detail;

std::u32string collapse(const std::u32string & raw) {
    return join(py_split(py_lower(py_strip(raw))), U' ');
}

}  // namespace

double metrics::anls(std::string_view prediction, std::span<const std::string> answers) {
    const std::u32string pred_raw = utf8_decode(prediction);
    const std::u32string det      = collapse(pred_raw);
    double               min_nl   = 1.0;
    for (const std::string & a : answers) {
        const std::u32string ans_raw = utf8_decode(a);
        const size_t         length  = std::max(ans_raw.size(), pred_raw.size());
        const double         nl      = length == 0 ? 0.0 : double(levenshtein(collapse(ans_raw), det)) / double(length);
        min_nl                       = std::min(min_nl, nl);
    }
    const double result = 1.0 - min_nl;
    return result < 0.5 ? 0.0 : result;
}

metric_result detail::score_anls(std::span<const metric_item> items) {
    return mean_over_items(items, [](const metric_item & it) { return metrics::anls(it.prediction, it.answers); });
}

}  // namespace ecokv
