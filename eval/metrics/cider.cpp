// cider: CIDEr-D (Vedantam et al., CVPR 2015, arXiv:1411.5726), as TextCaps (Sidorov et al., ECCV 2020,
// arXiv:2003.12462) reports it through pycocoevalcap (lmms-eval textcaps: PTBTokenizer, then Cider()).
//
// Reproduces pycocoevalcap/cider/cider_scorer.py (tylin/coco-caption at bfd1596, pip pycocoevalcap):
//   - precook: whitespace tokens of the PTB-tokenized caption, n-gram counts for n = 1..4;
//   - document frequency df(g): the number of images whose references (any of them) contain g;
//     ref_len = log(number of images);
//   - counts2vec: vec[n][g] = tf * (ref_len - log(max(1, df(g)))); norm[n] = sqrt(sum vec^2); the "length" is
//     the count of 2-grams (the script adds term_freq when the 0-based n-gram index is 1), not of words;
//   - sim: for each n, sum over the candidate's n-grams of min(vec_hyp, vec_ref) * vec_ref (clipping), divided
//     by norm_hyp * norm_ref when both are non-zero, times e^(-(delta^2) / (2 * 6^2)), delta = length_hyp -
//     length_ref;
//   - per image: the sims summed over references, averaged over n, divided by the reference count, x10;
//     the corpus score is the mean over images.
// Deviations: sums run in a different order than Python's dict iteration, so results agree to rounding
// (~1e-15 relative); tokens come from ptb_tokenize() (see ptb-tokenizer.cpp for how it approximates CoreNLP).
#include "metric-impl.h"

#include <array>
#include <cmath>
#include <numbers>
#include <unordered_map>
#include <unordered_set>

namespace ecokv {

namespace {

constexpr int    k_max_n = 4;
constexpr double k_sigma = 6.0;

// n-gram (tokens joined by ' ', which no PTB token contains) -> count, one map per n (index n - 1).
using ngram_counts = std::array<std::unordered_map<std::string, int>, k_max_n>;

ngram_counts precook(const std::vector<std::string> & words) {
    ngram_counts counts;
    for (int k = 1; k <= k_max_n; ++k) {
        for (size_t i = 0; i + size_t(k) <= words.size(); ++i) {
            std::string g = words[i];
            for (int j = 1; j < k; ++j) {
                g += ' ';
                g += words[i + j];
            }
            counts[k - 1][g] += 1;
        }
    }
    return counts;
}

struct tfidf {
    std::array<std::unordered_map<std::string, double>, k_max_n> vec;
    std::array<double, k_max_n>                                  norm{};
    int                                                          length = 0;  // 2-gram count, as the script
};

tfidf counts2vec(const ngram_counts & counts, const std::unordered_map<std::string, int> & df, double ref_len) {
    tfidf t;
    for (int n = 0; n < k_max_n; ++n) {
        for (const auto & [g, tf] : counts[n]) {
            const auto   it  = df.find(g);
            const double idf = ref_len - std::log(std::max(1.0, it == df.end() ? 0.0 : double(it->second)));
            const double v   = double(tf) * idf;
            t.vec[n][g]      = v;
            t.norm[n] += v * v;
            if (n == 1) {
                t.length += tf;
            }
        }
        t.norm[n] = std::sqrt(t.norm[n]);
    }
    return t;
}

std::array<double, k_max_n> sim(const tfidf & hyp, const tfidf & ref) {
    const double                delta   = double(hyp.length - ref.length);
    const double                penalty = std::pow(std::numbers::e, -(delta * delta) / (2 * k_sigma * k_sigma));
    std::array<double, k_max_n> val{};
    for (int n = 0; n < k_max_n; ++n) {
        for (const auto & [g, vh] : hyp.vec[n]) {
            const auto   it = ref.vec[n].find(g);
            const double vr = it == ref.vec[n].end() ? 0.0 : it->second;
            val[n] += std::min(vh, vr) * vr;
        }
        if (hyp.norm[n] != 0 && ref.norm[n] != 0) {
            val[n] /= hyp.norm[n] * ref.norm[n];
        }
        val[n] *= penalty;
    }
    return val;
}

}  // namespace

std::vector<double> metrics::cider_d(std::span<const metric_item> items) {
    std::vector<ngram_counts>              tests;
    std::vector<std::vector<ngram_counts>> refs;
    std::unordered_map<std::string, int>   df;
    for (const metric_item & it : items) {
        tests.push_back(precook(ptb_tokenize(it.prediction)));
        refs.emplace_back();
        std::unordered_set<std::string> seen;  // df counts an image once, whatever its references
        for (const std::string & a : it.answers) {
            refs.back().push_back(precook(ptb_tokenize(a)));
            for (const auto & by_n : refs.back().back()) {
                for (const auto & kv : by_n) {
                    seen.insert(kv.first);
                }
            }
        }
        for (const std::string & g : seen) {
            df[g] += 1;
        }
    }
    const double        ref_len = std::log(double(items.size()));
    std::vector<double> scores;
    for (size_t i = 0; i < items.size(); ++i) {
        const tfidf                 hyp = counts2vec(tests[i], df, ref_len);
        std::array<double, k_max_n> sum{};
        for (const ngram_counts & r : refs[i]) {
            const auto v = sim(hyp, counts2vec(r, df, ref_len));
            for (int n = 0; n < k_max_n; ++n) {
                sum[n] += v[n];
            }
        }
        double mean = 0;
        for (double v : sum) {
            mean += v;
        }
        mean /= k_max_n;
        scores.push_back(mean / double(refs[i].size()) * 10.0);
    }
    return scores;
}

metric_result detail::score_cider(std::span<const metric_item> items) {
    const std::vector<double> per_image = metrics::cider_d(items);
    metric_result             r;
    double                    sum = 0;
    for (double v : per_image) {
        sum += v;
    }
    r.n     = items.size();
    r.score = sum / double(items.size());
    return r;
}

}  // namespace ecokv
