// chars: character accuracy, 1 - CER (character error rate), for transcription tasks (OCR of a line or a page).
//
// No benchmark evaluator is reproduced; the definition is ours and deliberately plain. Per item and answer:
//   score = max(0, 1 - levenshtein(pred.strip(), answer) / max(1, len(answer)))
// with the distance over code points at unit costs, case kept, and the answer taken as it is (a newline in a
// multi-line transcription is a character to get right). The item's score is the max over its answers and the
// corpus score the mean over items. Clipping at 0 keeps a long hallucinated prediction from scoring below an
// empty one; max(1, ...) makes an empty answer score 1 for an empty prediction and 0 otherwise.
#include "metric-impl.h"
#include "metrics/text.h"

#include <algorithm>

namespace ecokv {

double metrics::char_accuracy(std::string_view prediction, std::span<const std::string> answers) {
    using namespace detail;
    const std::u32string pred = py_strip(utf8_decode(prediction));
    double               best = 0.0;
    for (const std::string & a : answers) {
        const std::u32string answer = utf8_decode(a);
        const double         cer    = double(levenshtein(pred, answer)) / double(std::max<size_t>(1, answer.size()));
        best                        = std::max(best, 1.0 - cer);
    }
    return best;  // starts at 0: the clip
}

metric_result detail::score_chars(std::span<const metric_item> items) {
    return mean_over_items(items,
                           [](const metric_item & it) { return metrics::char_accuracy(it.prediction, it.answers); });
}

}  // namespace ecokv
