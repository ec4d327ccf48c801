// ecokv eval: the benchmark datasets, read from their official layouts on disk and reached by name.
//
// Users download the datasets themselves; each reader takes the directory that holds the official files and
// returns the questions in file order. The layouts, splits and metrics are listed in docs/datasets.md, and the
// choices each reader makes are named at the top of eval/datasets/<name>.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ecokv {

// Where an image goes inside `context`: libmtmd's default media marker (mtmd_default_marker()). A context
// holds either no marker (the images then come first, before all the text) or exactly one per image, in order.
inline constexpr std::string_view image_marker = "<__media__>";

// One question (or one image to caption) of a dataset. The prompt is `context`, then `question`.
struct eval_item {
    std::string              id;        // unique within the dataset and stable across loads of the same files:
                                        // the dataset's own question id where it has one (resumed runs key on it)
    std::vector<std::string> images;    // absolute paths, in prompt order; empty for text-only items
    std::string              context;   // text before the question (instruction, haystack, document); may be
                                        // empty; holds image_marker where images are interleaved with text
    std::string              question;  // may be empty where the dataset's question ends the context (milebench)
    std::vector<std::string> answers;   // the references, at least one (VQA: the 10 human answers)
    std::string              type;      // category: OCRBench type, ChartQA split, MileBench task, ...; may be empty
};

struct dataset_info {
    std::string name;                    // registry name, as given to load_dataset()
    std::string description;             // one line: benchmark, split and files read
    std::string metric;                  // the name of its metric in list_metrics() (ecokv/metrics.h)
    bool        needs_directory = true;  // false: the items are generated (niah), the directory is optional
};

// Every registered dataset, in registry order.
const std::vector<dataset_info> & list_datasets();

// The registry entry of `name`; throws ecokv::error("unknown dataset 'x'; known: ocrbench, chartqa, ...").
const dataset_info & find_dataset(std::string_view name);

// Reads the dataset `name` from the directory `dir` (relative paths are taken from the current directory).
// Throws ecokv::error naming the file at fault: a missing file, invalid JSON ("val.json:12: invalid JSON at
// column 5: ..."), a missing or mistyped field with its entry ("val.json: data[3]: missing \"answers\"") or
// JSONL line ("items.jsonl:4: ..."), no items, a duplicate id, and missing images (their count and the first
// missing path), and an empty `dir` where the dataset needs_directory. `niah` generates its items: `dir` may
// be empty, or hold an optional niah.json (niah_params).
std::vector<eval_item> load_dataset(std::string_view name, const std::string & dir);

// The needle-in-a-haystack generator for text models (RULER's niah_single form). Item i hides the needle
// "The special magic number for <key> is <7-digit number>." in a haystack of filler sentences; the question
// is "What is the special magic number for <key>?" and the answer the number. Depths and lengths are spread
// over the items: item i has depth level i % n_depths and length level (i / n_depths) % n_lengths.
struct niah_params {
    uint64_t    seed          = 42;   // seeds keys, numbers and filler: the same params give the same items
    int32_t     count         = 20;   // number of items
    int32_t     context_words = 256;  // haystack words of the longest items, needle not counted (whole sentences
                                      // up to that many words, at least one sentence)
    int32_t     n_lengths     = 4;    // length levels: context_words * (l + 1) / n_lengths words, l < n_lengths
    int32_t     n_depths      = 5;    // depth levels: the needle after d / (n_depths - 1) of the haystack words
                                      // (0 = first sentence, 1 = last), d < n_depths; 1 level puts it at 0.5
    std::string haystack_file;        // a UTF-8 text file to take filler sentences from, cyclically from a
                                      // seeded start; empty: sentences generated from a small fixed vocabulary

    // Throws ecokv::error naming the option and its bound ("niah: count 0 must be at least 1").
    void validate() const;
};

// Makes params.count items: ids "niah-0", "niah-1", ...; context the haystack with the needle; type
// "words=<length level> depth=<requested depth, percent>%" ("words=128 depth=25%"). The needle sits between two
// filler sentences, at the sentence boundary nearest the requested depth (in words). Throws ecokv::error on
// invalid params or an unreadable or empty haystack_file.
std::vector<eval_item> make_niah(const niah_params & params);

}  // namespace ecokv
