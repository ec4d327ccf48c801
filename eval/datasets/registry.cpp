// ecokv eval: THE list of datasets (name, one-line description, metric, reader) and the checks every reader
// relies on: a readable directory, at least one item, unique ids, answers, and images that exist.
#include "datasets/dataset-impl.h"
#include "ecokv/error.h"

#include <map>

namespace ecokv {

namespace {

struct dataset_entry {
    dataset_info       info;
    detail::dataset_fn fn;
};

// One line per dataset. The same table drives `--list`, --help, docs/datasets.md and the tests.
// Columns: { name, description, metric, needs_directory (default true) } (ecokv/datasets.h), reader.
const std::vector<dataset_entry> & registry() {
    static const std::vector<dataset_entry> entries = {
        { { "ocrbench", "OCRBench (1000 questions): OCRBench.json + OCRBench_Images/", "ocrbench" },
          detail::load_ocrbench },
        { { "chartqa", "ChartQA test: test_human.json + test_augmented.json + png/", "relaxed" },
          detail::load_chartqa },
        { { "textvqa", "TextVQA 0.5.1 val: TextVQA_0.5.1_val.json + train_images/", "vqa" }, detail::load_textvqa },
        { { "docvqa", "DocVQA val: val_v1.0_withQT.json (or val_v1.0.json) + documents/", "anls" },
          detail::load_docvqa },
        { { "textcaps", "TextCaps 0.1 val, one item per image: TextCaps_0.1_val.json + train_images/", "cider" },
          detail::load_textcaps },
        { { "mpdocvqa", "MP-DocVQA val, all pages of the document: val.json + images/", "anls" },
          detail::load_mpdocvqa },
        { { "milebench", "MileBench tasks: <task>/<task>.json + <task>/images/ (TextNeedleInAHaystack, ...)",
            "exact" },
          detail::load_milebench },
        { { "generated", "ecokv's generated suite: items.jsonl + images relative to it", "exact" },
          detail::load_generated },
        { { "niah", "needle in a haystack for text models, generated (optional niah.json)", "exact", false },
          detail::load_niah },
    };
    return entries;
}

const dataset_entry & find_entry(std::string_view name) {
    for (const dataset_entry & e : registry()) {
        if (e.info.name == name) {
            return e;
        }
    }
    std::string known;
    for (const dataset_entry & e : registry()) {
        known += (known.empty() ? "" : ", ") + e.info.name;
    }
    throw error("unknown dataset '" + std::string(name) + "'; known: " + known);
}

void check_items(const std::string & name, const std::string & dir, const std::vector<eval_item> & items) {
    if (items.empty()) {
        throw error(name + ": no items in " + dir);
    }
    std::map<std::string_view, size_t> seen;
    size_t                             n_images = 0, n_missing = 0;
    const std::string *                first_missing = nullptr;
    const eval_item *                  first_item    = nullptr;
    for (size_t i = 0; i < items.size(); ++i) {
        const eval_item & it = items[i];
        // The readers guarantee these; a failure here is a reader bug, reported with the item all the same.
        if (!seen.emplace(it.id, i).second) {
            throw error(name + ": duplicate id '" + it.id + "' (items " + std::to_string(seen[it.id] + 1) + " and " +
                        std::to_string(i + 1) + ")");
        }
        if (it.answers.empty()) {
            throw error(name + ": item '" + it.id + "' has no answers");
        }
        for (const std::string & img : it.images) {
            ++n_images;
            if (!detail::fs::is_regular_file(img)) {
                if (n_missing++ == 0) {
                    first_missing = &img;
                    first_item    = &it;
                }
            }
        }
    }
    if (n_missing > 0) {
        throw error(name + ": " + std::to_string(n_missing) + " of " + std::to_string(n_images) +
                    " images missing; first: " + *first_missing + " (item '" + first_item->id + "')");
    }
}

}  // namespace

const std::vector<dataset_info> & list_datasets() {
    static const std::vector<dataset_info> infos = [] {
        std::vector<dataset_info> out;
        for (const dataset_entry & e : registry()) {
            out.push_back(e.info);
        }
        return out;
    }();
    return infos;
}

const dataset_info & find_dataset(std::string_view name) {
    return find_entry(name).info;
}

std::vector<eval_item> load_dataset(std::string_view name, const std::string & dir) {
    const dataset_entry & e = find_entry(name);
    detail::fs::path      root;
    if (!dir.empty()) {
        root = detail::fs::absolute(dir).lexically_normal();
        if (!root.has_filename() && root != root.root_path()) {
            root = root.parent_path();  // "data/ocrbench/" -> "data/ocrbench"
        }
        if (!detail::fs::is_directory(root)) {
            throw error(e.info.name + ": " + root.string() + ": no such directory");
        }
    } else if (e.info.needs_directory) {
        throw error(e.info.name + ": no dataset directory given");
    }
    std::vector<eval_item> items = e.fn(root);
    check_items(e.info.name, root.empty() ? "(generated)" : root.string(), items);
    return items;
}

}  // namespace ecokv
