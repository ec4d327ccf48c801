// ecokv eval: TextCaps (Sidorov et al., "TextCaps: a Dataset for Image Captioning with Reading Comprehension",
// arXiv 2003.12462), val split v0.1, scored with CIDEr-D.
//
// Layout (textvqa.org/textcaps/dataset): TextCaps_0.1_val.json, {"data": [{"image_id", "image_name",
// "image_path" ("train/<id>.jpg"), "caption_id", "caption_str", "reference_strs" [5], ...}]} with one entry per
// caption, and the images of train_val_images.zip, which unpacks to train_images/<image_id>.jpg.
// Choices:
// - One item per image (the captioning evaluation is per image, as lmms-eval's textcaps_val and big_vision's
//   text_caps builder group by image_id), in the order of first appearance; its id is the image_id.
// - The references are the image's "reference_strs" (lmms-eval's textcaps answers); entries without them give
//   their "caption_str" instead, collected over the image's entries (big_vision).
// - "image_path" is not used: it names train/, while the official image zip unpacks to train_images/.
// - The question is lmms-eval's captioning instruction, below.
#include "datasets/dataset-impl.h"
#include "ecokv/error.h"

#include <map>

namespace ecokv::detail {

namespace {

const char * k_caption_prompt = "Please carefully observe the image and come up with a caption for the image.";

}  // namespace

std::vector<eval_item> load_textcaps(const fs::path & dir) {
    const fs::path path = dir / "TextCaps_0.1_val.json";
    const json     root = read_json(path);
    const json &   data = array_member(root, "data", path.string());
    std::vector<eval_item>        items;
    std::map<std::string, size_t> index;    // image_id -> item
    std::vector<bool>             has_refs;  // per item: answers came from reference_strs
    for (size_t i = 0; i < data.size(); ++i) {
        const json &      e        = data[i];
        const std::string where    = entry_where(path, "data", i);
        const std::string image_id = string_member(e, "image_id", where);
        auto [at, fresh]           = index.emplace(image_id, items.size());
        if (fresh) {
            eval_item it;
            it.id       = image_id;
            it.images   = { resolve_image(dir / "train_images", image_id + ".jpg", where) };
            it.question = k_caption_prompt;
            items.push_back(std::move(it));
            has_refs.push_back(false);
        }
        eval_item & it = items[at->second];
        if (e.contains("reference_strs")) {
            if (!has_refs[at->second]) {
                it.answers             = answers_member(e, "reference_strs", where);
                has_refs[at->second] = true;
            }
        } else if (!has_refs[at->second]) {
            it.answers.push_back(string_member(e, "caption_str", where));
        }
    }
    return items;
}

}  // namespace ecokv::detail
