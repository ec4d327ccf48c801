// ecokv eval: the official metrics of the multimodal QA and captioning benchmarks, reached by name.
//
// Each metric reproduces its benchmark's own evaluator (the file and the deliberate deviations are named at the
// top of eval/metrics/<name>.cpp). Strings are UTF-8; the evaluators are Python, so "character" below means a
// Unicode code point and "whitespace" Python's str.isspace().
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ecokv {

// One scored question or image: the model's output and the reference answers (or captions).
struct metric_item {
    std::string              prediction;
    std::vector<std::string> answers;  // at least one; VQA expects the 10 human answers
    std::string              type;     // question category (OCRBench's "type"); empty when unused
};

// A per-category count (OCRBench's breakdown).
struct metric_group {
    size_t n       = 0;  // items of this category
    size_t correct = 0;  // items scored correct
    double score   = 0;  // correct / n
};

struct metric_result {
    std::string                         metric;     // registry name
    double                              score = 0;  // mean over items in [0, 1]; CIDEr-D is x10 and unbounded above
    size_t                              n     = 0;  // items scored
    std::optional<size_t>               correct;    // counting metrics (ocrbench): items scored correct
    std::map<std::string, metric_group> by_type;    // ocrbench: per question type, sorted by name
};

struct metric_info {
    std::string name;
    std::string description;           // one line: benchmark and reference evaluator
    bool        needs_type   = false;  // every item must carry a non-empty `type`
    bool        whole_output = false;  // scores the whole generated text (transcriptions), not only its first line
    bool        corpus_only  = false;  // no per-item score: only the corpus has one (CIDEr's document frequencies)
};

// Every registered metric, in registry order.
const std::vector<metric_info> & list_metrics();

// The registry entry of `name`; throws ecokv::error("unknown metric 'x'; known: exact, relaxed, ...").
const metric_info & find_metric(std::string_view name);

// Scores `items` with the metric `name`. Corpus metrics (cider) need the whole list at once: the document
// frequencies come from all the references. Throws ecokv::error on an unknown name, on no items, on an item
// without answers, and (needs_type) on an item without a type; item numbers in messages are 1-based.
metric_result evaluate(std::string_view name, std::span<const metric_item> items);

// Reads JSON Lines: one object per line with "prediction" (string), "answers" (a non-empty array of strings,
// or one string taken as the only answer) and, optional unless the metric `name` needs it, "type" (string).
// Other keys are ignored, and so are blank lines. Throws ecokv::error naming the file, and the 1-based line for
// a bad line: "preds.jsonl:3: missing \"answers\"". With an empty `name` no metric is checked.
std::vector<metric_item> read_metric_items(const std::string & path, std::string_view name = {});

// One JSON object on one line: {"metric": ..., "score": ..., "n": ...} plus "correct" and "by_type" when set.
std::string metric_result_json(const metric_result & result);

// Per-item forms of the metrics, for tests and for callers that score one answer at a time. The corpus-level
// scores above are their means (cider excepted, metric_info::corpus_only: it is per image but its weights
// depend on the corpus).
namespace metrics {

// exact: 1 when some answer equals the prediction after strip() and lower(), else 0.
double exact_match(std::string_view prediction, std::span<const std::string> answers);

// Python's float(text) (surrounding whitespace, '_' between digits, inf/nan); nullopt where it raises.
std::optional<double> python_float(std::string_view text);

// relaxed (ChartQA): numbers within 5% of a non-zero target ("12%" reads 0.12), else case-insensitive
// equality. The prediction is stripped first, the target is not (Qwen-VL's caller).
bool   relaxed_correctness(std::string_view prediction, std::string_view target);
double relaxed_accuracy(std::string_view prediction, std::span<const std::string> answers);  // max over answers

// vqa: the EvalAI answer normalisation (lower-casing, punctuation, digit words, articles, contractions).
std::string vqa_normalize(std::string_view answer);
// Mean over the leave-one-out subsets of the answers of min(1, matches / 3). With k answers the subsets have
// k - 1 answers each, so a single answer always scores 0, as the official formula gives.
double vqa_accuracy(std::string_view prediction, std::span<const std::string> answers);

// anls (DocVQA): max over answers of 1 - NL, 0 when that is below 0.5; NL = Levenshtein distance between the
// lower-cased, whitespace-collapsed strings over the longer of the two raw lengths.
double anls(std::string_view prediction, std::span<const std::string> answers);

// chars (transcriptions): max over answers of max(0, 1 - L / max(1, len(answer))), L = Levenshtein distance
// between the stripped prediction and the answer as it is (code points, case kept, '\n' a character).
double char_accuracy(std::string_view prediction, std::span<const std::string> answers);

// ocrbench: an answer is a substring of the prediction after lower() and strip() ('\n' read as ' '); for
// "Handwritten Mathematical Expression Recognition" case is kept and spaces and newlines are removed.
bool ocrbench_correct(std::string_view prediction, std::span<const std::string> answers, std::string_view type);

// The coco-caption PTBTokenizer (Stanford PTBLexer, -lowerCase) followed by its punctuation filter.
std::vector<std::string> ptb_tokenize(std::string_view caption);

// rougel: pycocoevalcap's ROUGE-L (LCS, beta 1.2, precision and recall maxed over the references) on the
// PTB tokens of the candidate and the references.
double rouge_l(std::string_view candidate, std::span<const std::string> references);

// cider: pycocoevalcap's CIDEr-D for each item (image): n-grams 1-4 over PTB tokens, idf from the references
// of all the items, clipping, Gaussian length penalty (sigma 6), x10. Empty `items` gives an empty vector.
std::vector<double> cider_d(std::span<const metric_item> items);

}  // namespace metrics

}  // namespace ecokv
