// ecokv eval: OCRBench (Liu et al., "OCRBench: On the Hidden Mystery of OCR in Large Multimodal Models",
// arXiv 2305.07895), the 1000 questions of github.com/Yuliang-Liu/MultimodalOCR.
//
// Layout (OCRBench/json_files/OCRBench.json and the OCRBench_Images download): <dir>/OCRBench.json, a list of
// {"dataset_name", "id", "image_path", "question", "answers", "type"}, and the images under
// <dir>/OCRBench_Images/<image_path>, as the official scripts join --image_folder ./OCRBench_Images and
// image_path (OCRBench/scripts/qwenvl.py).
// Choices:
// - "id" counts within each source dataset (IIIT5K and IC13_857 both have 211), so the item id is
//   "<dataset_name>/<id>"; should that pair repeat, the repeats get "#2", "#3", ... in file order.
// - "answers" is a string or a list of strings, as the official scorer accepts both.
#include "datasets/dataset-impl.h"
#include "ecokv/error.h"

#include <map>

namespace ecokv::detail {

std::vector<eval_item> load_ocrbench(const fs::path & dir) {
    const fs::path path = dir / "OCRBench.json";
    const json     root = read_json(path);
    if (!root.is_array()) {
        throw error(path.string() + ": expected a list of questions, not " + root.type_name());
    }
    const fs::path                images = dir / "OCRBench_Images";
    std::map<std::string, size_t> n_seen;
    std::vector<eval_item>        items;
    for (size_t i = 0; i < root.size(); ++i) {
        const json &      e     = root[i];
        const std::string where = path.string() + ": [" + std::to_string(i) + "]";
        eval_item         it;
        it.id = string_member(e, "dataset_name", where) + "/" + string_member(e, "id", where, true);
        if (const size_t n = ++n_seen[it.id]; n > 1) {
            it.id += '#';
            it.id += std::to_string(n);
        }
        it.images   = { resolve_image(images, string_member(e, "image_path", where), where) };
        it.question = string_member(e, "question", where);
        it.answers  = answers_member(e, "answers", where);
        it.type     = string_member(e, "type", where);
        items.push_back(std::move(it));
    }
    return items;
}

}  // namespace ecokv::detail
