// ecokv eval: THE list of metrics (name, one-line description, function) and the checks every metric relies on.
#include "ecokv/error.h"
#include "metrics/metric-impl.h"

#include <string>

namespace ecokv {

namespace {

struct metric_entry {
    metric_info       info;
    detail::metric_fn fn;
};

// One line per metric. The same table drives `ecokv metric --list`, --help and the tests.
// Columns: { name, description, needs_type, whole_output, corpus_only } (ecokv/metrics.h), scoring function.
const std::vector<metric_entry> & registry() {
    static const std::vector<metric_entry> entries = {
        { { "exact", "exact match after strip() and lower(), max over the answers", false }, detail::score_exact },
        { { "relaxed", "ChartQA relaxed accuracy: numbers within 5% (lmms-eval / Qwen-VL relaxed_correctness)", false },
          detail::score_relaxed },
        { { "vqa", "TextVQA/VQAv2 accuracy: EvalAI normalisation, min(1, matches/3) over leave-one-out subsets",
            false },
          detail::score_vqa },
        { { "anls", "DocVQA ANLS, threshold 0.5 (official infographicsvqa_eval.py)", false }, detail::score_anls },
        { { "chars", "transcription character accuracy: 1 - Levenshtein over code points / answer length, min 0",
            false, true },
          detail::score_chars },
        { { "cider", "TextCaps CIDEr-D (pycocoevalcap Cider on PTB tokens, corpus idf, x10)", false, false, true },
          detail::score_cider },
        { { "rougel", "ROUGE-L F (pycocoevalcap Rouge, beta 1.2, on PTB tokens)", false }, detail::score_rougel },
        { { "ocrbench", "OCRBench accuracy: answer contained in the prediction, HME without spaces; by type", true },
          detail::score_ocrbench },
    };
    return entries;
}

const metric_entry & find_entry(std::string_view name) {
    for (const metric_entry & e : registry()) {
        if (e.info.name == name) {
            return e;
        }
    }
    std::string known;
    for (const metric_entry & e : registry()) {
        known += (known.empty() ? "" : ", ") + e.info.name;
    }
    throw error("unknown metric '" + std::string(name) + "'; known: " + known);
}

}  // namespace

const std::vector<metric_info> & list_metrics() {
    static const std::vector<metric_info> infos = [] {
        std::vector<metric_info> out;
        for (const metric_entry & e : registry()) {
            out.push_back(e.info);
        }
        return out;
    }();
    return infos;
}

const metric_info & find_metric(std::string_view name) {
    return find_entry(name).info;
}

metric_result evaluate(std::string_view name, std::span<const metric_item> items) {
    const metric_entry & e = find_entry(name);
    if (items.empty()) {
        throw error("metric " + e.info.name + ": no items to score");
    }
    for (size_t i = 0; i < items.size(); ++i) {
        if (items[i].answers.empty()) {
            throw error("metric " + e.info.name + ": item " + std::to_string(i + 1) + " has no answers");
        }
        if (e.info.needs_type && items[i].type.empty()) {
            throw error("metric " + e.info.name + ": item " + std::to_string(i + 1) +
                        " has no type (the question category)");
        }
    }
    metric_result r = e.fn(items);
    r.metric        = e.info.name;
    return r;
}

}  // namespace ecokv
