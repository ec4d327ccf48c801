// ecokv eval: MP-DocVQA (Tito et al., "Hierarchical multimodal transformers for Multi-Page DocVQA",
// arXiv 2212.05935), val split, scored with ANLS.
//
// Layout (rrc.cvc.uab.es/?ch=17, Task 4): val.json, {"dataset_name", "dataset_split", "data": [{"questionId",
// "question", "doc_id", "page_ids" [...], "answers", "answer_page_idx", ...}]}, and the page images under
// images/<page_id>.jpg.
// Choices:
// - Every page of the document is given, in page order (up to 20), with no context text: the reader does no
//   page retrieval, which is the long-context setting the KV-cache methods are tested in. The runner puts the
//   images before the question (no image_marker in the context).
// - The item type is the page count ("pages=4"), for a breakdown by document length.
// - The test split has no "answers" and is refused by the missing-field check.
#include "datasets/dataset-impl.h"
#include "ecokv/error.h"

namespace ecokv::detail {

std::vector<eval_item> load_mpdocvqa(const fs::path & dir) {
    const fs::path path = dir / "val.json";
    return map_entries(path, "data", [&](const json & e, const std::string & where) {
        eval_item it;
        it.id = string_member(e, "questionId", where, true);
        for (const std::string & page : strings_member(e, "page_ids", where)) {
            it.images.push_back(resolve_image(dir / "images", page + ".jpg", where));
        }
        if (it.images.empty()) {
            throw error(where + ": \"page_ids\" is empty");
        }
        it.question = string_member(e, "question", where);
        it.answers  = answers_member(e, "answers", where);
        it.type     = "pages=" + std::to_string(it.images.size());
        return it;
    });
}

}  // namespace ecokv::detail
