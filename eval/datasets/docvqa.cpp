// ecokv eval: DocVQA (Mathew et al., "DocVQA: A Dataset for VQA on Document Images", arXiv 2007.00398), single
// page task, val split, scored with ANLS.
//
// Layout (rrc.cvc.uab.es/?ch=17, Task 1, val.tar.gz): val_v1.0_withQT.json or val_v1.0.json, {"dataset_name",
// "dataset_split", "data": [{"questionId", "question", "question_types"?, "image" ("documents/<page>.png"),
// "docId", "answers", ...}]}, with "image" relative to the directory of the JSON file.
// Choices:
// - val_v1.0_withQT.json is read when present (it adds "question_types"), else val_v1.0.json.
// - The item type is the question types joined with "," ("table/list,form"); empty without them.
// - The test split has no "answers" and is refused by the missing-field check.
#include "datasets/dataset-impl.h"
#include "ecokv/error.h"

namespace ecokv::detail {

std::vector<eval_item> load_docvqa(const fs::path & dir) {
    const fs::path path = find_file(dir, { "val_v1.0_withQT.json", "val_v1.0.json" });
    return map_entries(path, "data", [&](const json & e, const std::string & where) {
        eval_item it;
        it.id       = string_member(e, "questionId", where, true);
        it.images   = { resolve_image(dir, string_member(e, "image", where), where) };
        it.question = string_member(e, "question", where);
        it.answers  = answers_member(e, "answers", where);
        if (e.contains("question_types")) {
            for (const std::string & t : strings_member(e, "question_types", where)) {
                it.type += (it.type.empty() ? "" : ",") + t;
            }
        }
        return it;
    });
}

}  // namespace ecokv::detail
