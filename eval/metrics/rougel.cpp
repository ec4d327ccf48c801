// rougel: ROUGE-L F-measure (Lin, ACL Workshop 2004) as the coco-caption toolkit computes it.
//
// Reproduces pycocoevalcap/rouge/rouge.py (tylin/coco-caption at bfd1596): tokens are candidate.split(" ") of
// the PTB-tokenized caption (so an empty caption is one empty token); for each reference, LCS length over
// tokens gives precision lcs/len(candidate) and recall lcs/len(reference); prec_max and rec_max are the maxima
// over the references (possibly from different ones), and
//   score = (1 + beta^2) * prec_max * rec_max / (rec_max + beta^2 * prec_max), beta = 1.2,
// or 0 when either maximum is 0. The corpus score is the mean over items.
// Reading: the evaluator always runs on PTBTokenizer output (pycocoevalcap's eval.py and lmms-eval's caption
// tasks tokenize first), so candidate and references go through ptb_tokenize() here: lower-cased, punctuation
// split off and dropped.
#include "metric-impl.h"

#include <algorithm>

namespace ecokv {

namespace {

// The tokens rouge.py sees: split(" ") of the ' '-joined PTB tokens.
std::vector<std::string> rouge_tokens(std::string_view caption) {
    std::vector<std::string> t = metrics::ptb_tokenize(caption);
    if (t.empty()) {
        t.emplace_back();  // "".split(" ") == [""]
    }
    return t;
}

size_t lcs(const std::vector<std::string> & a, const std::vector<std::string> & b) {
    std::vector<size_t> prev(b.size() + 1, 0), cur(b.size() + 1, 0);
    for (size_t i = 1; i <= a.size(); ++i) {
        for (size_t j = 1; j <= b.size(); ++j) {
            cur[j] = a[i - 1] == b[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
        }
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

}  // namespace

double metrics::rouge_l(std::string_view candidate, std::span<const std::string> references) {
    constexpr double               beta     = 1.2;
    const std::vector<std::string> c        = rouge_tokens(candidate);
    double                         prec_max = 0, rec_max = 0;
    for (const std::string & ref : references) {
        const std::vector<std::string> r = rouge_tokens(ref);
        const double                   l = double(lcs(r, c));
        prec_max                         = std::max(prec_max, l / double(c.size()));
        rec_max                          = std::max(rec_max, l / double(r.size()));
    }
    if (prec_max == 0 || rec_max == 0) {
        return 0.0;
    }
    return (1 + beta * beta) * prec_max * rec_max / (rec_max + beta * beta * prec_max);
}

metric_result detail::score_rougel(std::span<const metric_item> items) {
    return mean_over_items(items, [](const metric_item & it) { return metrics::rouge_l(it.prediction, it.answers); });
}

}  // namespace ecokv
