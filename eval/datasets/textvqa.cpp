// ecokv eval: TextVQA (Singh et al., "Towards VQA Models That Can Read", arXiv 1904.08920), val split v0.5.1,
// scored with the VQA accuracy over the 10 human answers.
//
// Layout (textvqa.org/dataset): TextVQA_0.5.1_val.json, {"data": [{"question_id", "image_id", "question",
// "answers" (10), ...}]}, and the images of train_val_images.zip, which unpacks to train_images/<image_id>.jpg
// (val images are OpenImages train images).
// Choices:
// - The question is kept as written; the prompt suffix ("Answer the question using a single word or phrase.",
//   lmms-eval) and the OCR tokens some prompts add belong to the runner.
#include "datasets/dataset-impl.h"
#include "ecokv/error.h"

namespace ecokv::detail {

std::vector<eval_item> load_textvqa(const fs::path & dir) {
    const fs::path path = dir / "TextVQA_0.5.1_val.json";
    return map_entries(path, "data", [&](const json & e, const std::string & where) {
        eval_item it;
        it.id       = string_member(e, "question_id", where, true);
        it.images   = { resolve_image(dir / "train_images", string_member(e, "image_id", where) + ".jpg", where) };
        it.question = string_member(e, "question", where);
        it.answers  = answers_member(e, "answers", where);
        return it;
    });
}

}  // namespace ecokv::detail
