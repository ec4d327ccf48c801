// ocrbench: OCRBench accuracy (Liu et al., Sci. China Inf. Sci. 2024, arXiv:2305.07895), with its breakdown by
// question type.
//
// Reproduces the scoring loop of Yuliang-Liu/MultimodalOCR OCRBench/scripts/*.py (e.g. qwenvl.py): an item is
// correct when some answer is a substring of the prediction (Python `in`, so an empty answer always is), after
//   - "Handwritten Mathematical Expression Recognition" (the HME100k items): x.strip().replace("\n", " ")
//     .replace(" ", ""), case kept;
//   - every other type: x.lower().strip().replace("\n", " ").
// The official script picks the HME rule by dataset_name == "HME100k"; every HME100k item and no other has the
// HME type, so the type decides here. Score: correct / n (the official total is out of 1000 items, which is
// the same thing on the full set); correct and per-type counts are reported as well.
// Deviations: lmms-eval lower-cases the prediction for HME too (so an answer with capitals never matches
// there); this follows the official script. lower() is text.h's.
#include "metric-impl.h"
#include "metrics/text.h"

namespace ecokv {

namespace {

using namespace detail;

constexpr std::string_view k_hme_type = "Handwritten Mathematical Expression Recognition";

std::u32string prepare(std::string_view text, bool hme) {
    if (hme) {
        return replace_all(replace_all(py_strip(utf8_decode(text)), U"\n", U" "), U" ", U"");
    }
    return replace_all(py_strip(py_lower(utf8_decode(text))), U"\n", U" ");
}

}  // namespace

bool metrics::ocrbench_correct(std::string_view prediction, std::span<const std::string> answers,
                               std::string_view type) {
    const bool           hme  = type == k_hme_type;
    const std::u32string pred = prepare(prediction, hme);
    for (const std::string & a : answers) {
        if (contains(pred, prepare(a, hme))) {
            return true;
        }
    }
    return false;
}

metric_result detail::score_ocrbench(std::span<const metric_item> items) {
    metric_result r;
    size_t        correct = 0;
    for (const metric_item & it : items) {
        const bool     ok = metrics::ocrbench_correct(it.prediction, it.answers, it.type);
        metric_group & g  = r.by_type[it.type];
        g.n += 1;
        g.correct += ok ? 1 : 0;
        correct += ok ? 1 : 0;
    }
    for (auto & [type, g] : r.by_type) {
        g.score = double(g.correct) / double(g.n);
    }
    r.n       = items.size();
    r.correct = correct;
    r.score   = double(correct) / double(items.size());
    return r;
}

}  // namespace ecokv
