// ecokv eval: ChartQA (Masry et al., "ChartQA: A Benchmark for Question Answering about Charts with Visual and
// Logical Reasoning", arXiv 2203.10244), test split, scored with relaxed accuracy.
//
// Layout (github.com/vis-nlp/ChartQA, "ChartQA Dataset/test/"): test_human.json and test_augmented.json, each a
// list of {"imgname", "query", "label"}, and the charts under png/<imgname>. Both files are read, human first,
// as the reported ChartQA score is the mean over both (lmms-eval's chartqa task, Qwen-VL's evaluate_vqa.py).
// Choices:
// - The files carry no question id, so the item id is "<human|augmented>/<index in the file>"; the same part is
//   the item type, for a per-split breakdown.
// - A numeric "label" is taken in its JSON spelling.
#include "datasets/dataset-impl.h"
#include "ecokv/error.h"

namespace ecokv::detail {

std::vector<eval_item> load_chartqa(const fs::path & dir) {
    std::vector<eval_item> items;
    for (const char * part : { "human", "augmented" }) {
        const fs::path path = dir / ("test_" + std::string(part) + ".json");
        const json     root = read_json(path);
        if (!root.is_array()) {
            throw error(path.string() + ": expected a list of questions, not " + root.type_name());
        }
        for (size_t i = 0; i < root.size(); ++i) {
            const json &      e     = root[i];
            const std::string where = path.string() + ": [" + std::to_string(i) + "]";
            eval_item         it;
            it.id       = std::string(part) + "/" + std::to_string(i);
            it.images   = { resolve_image(dir / "png", string_member(e, "imgname", where), where) };
            it.question = string_member(e, "query", where);
            it.answers  = { string_member(e, "label", where, true) };
            it.type     = part;
            items.push_back(std::move(it));
        }
    }
    return items;
}

}  // namespace ecokv::detail
