// ecokv eval: MileBench (Song et al., "MileBench: Benchmarking MLLMs in Long Context", arXiv 2404.18532), the
// long multimodal contexts of the MadaKV and LOOK-M evaluations; TextNeedleInAHaystack is the text needle task.
//
// Layout (github.com/MileBench/MileBench, generate.py and utils.py): <dir>/<task>/<task>.json, {"meta_data":
// {"task_instruction": [...], "question_type", ...}, "data": [{"sample_id", "task_instruction_id",
// "task_instance": {"context" (with {image#k} / {table#k} where image k goes), "images_path" [...],
// "choice_list"?}, "response", ...}]}, and the images under <dir>/<task>/images/. <dir> is the MileBench root
// (every task found is read, in name order) or one task's directory.
// The prompt follows MileBenchDataset.__getitem__ (utils.py) without its truncation:
// - context = task_instruction[task_instruction_id] + "\n" + the task context with {image#k} and {table#k}
//   replaced by image_marker, k = 1..number of images; the question is the end of that context.
// - question: for multi-choice tasks the choice block "Choice list: \nA. ...\nYour answer is: " (GPR1200 without
//   the letters, as upstream), else empty.
// Deviations and choices:
// - No left truncation to the model's context (upstream keeps the instruction and the end of the context): the
//   runner sees the whole context, which is what the KV-cache budget is tested on.
// - Images whose placeholder is missing from the context come first, at the start of the task context (upstream
//   keeps one such image there and drops the others). More placeholders than images is an error.
// - answers: the response; for lettered multi-choice tasks also the letter of the response in the choice list,
//   so that `exact` accepts "B" as MileBench's option matcher does. The official scores are option matching
//   (multi-choice), ROUGE-L (open-ended) and "answer among the words of the prediction" (needle tasks); the
//   registry's `exact` is the stricter reading used for the needle task.
// - id "<task>/<sample_id>", type the task name.
#include "datasets/dataset-impl.h"
#include "ecokv/error.h"

#include <algorithm>

namespace ecokv::detail {

namespace {

size_t replace_all(std::string & text, const std::string & from, std::string_view to) {
    size_t n = 0;
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
        text.replace(at, from.size(), to);
        ++n;
    }
    return n;
}

size_t count_of(const std::string & text, std::string_view what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) {
        ++n;
    }
    return n;
}

std::vector<eval_item> load_task(const fs::path & task_dir) {
    const std::string task = task_dir.filename().string();
    const fs::path    path = task_dir / (task + ".json");
    const json        root = read_json(path);
    const json &      meta = member(root, "meta_data", path.string());
    const std::vector<std::string> instructions =
        strings_member(meta, "task_instruction", path.string() + ": meta_data");
    const json &                   data         = array_member(root, "data", path.string());

    std::vector<eval_item> items;
    for (size_t i = 0; i < data.size(); ++i) {
        const json &      e     = data[i];
        const std::string where = entry_where(path, "data", i);
        eval_item         it;
        it.id   = task + "/" + string_member(e, "sample_id", where, true);
        it.type = task;

        const json & iid = member(e, "task_instruction_id", where);
        if (!iid.is_number_unsigned() || iid.get<size_t>() >= instructions.size()) {
            throw error(where + ": \"task_instruction_id\" must index meta_data.task_instruction (" +
                        std::to_string(instructions.size()) + " instructions), not " + iid.dump());
        }
        const json &                   inst   = member(e, "task_instance", where);
        const std::string              iwhere = where + ".task_instance";
        std::string                    text   = string_member(inst, "context", iwhere);
        const std::vector<std::string> paths  = strings_member(inst, "images_path", iwhere);
        for (const std::string & p : paths) {
            it.images.push_back(resolve_image(task_dir / "images", p, iwhere));
        }
        for (size_t k = 1; k <= paths.size(); ++k) {
            replace_all(text, "{image#" + std::to_string(k) + "}", image_marker);
            replace_all(text, "{table#" + std::to_string(k) + "}", image_marker);
        }
        const size_t n_markers = count_of(text, image_marker);
        if (n_markers > paths.size()) {
            throw error(iwhere + ": the context has " + std::to_string(n_markers) + " image placeholders for " +
                        std::to_string(paths.size()) + " images");
        }
        if (n_markers > 0 && n_markers < paths.size()) {
            std::string lead;
            for (size_t k = n_markers; k < paths.size(); ++k) {
                lead += image_marker;
            }
            text = lead + text;
        }
        it.context = instructions[iid.get<size_t>()] + "\n" + text;

        it.answers = { string_member(e, "response", where, true) };
        if (inst.contains("choice_list")) {
            const std::vector<std::string> choices = strings_member(inst, "choice_list", iwhere);
            const bool                     letters = task != "GPR1200";
            it.question                            = "Choice list: \n";
            for (size_t c = 0; c < choices.size(); ++c) {
                it.question += (c ? "\n" : "") + (letters ? std::string(1, char('A' + c)) + ". " : "") +
                               choices[c];
            }
            it.question += "\nYour answer is: ";
            const auto hit = std::find(choices.begin(), choices.end(), it.answers[0]);
            if (letters && hit != choices.end() && choices.size() <= 26) {
                it.answers.push_back(std::string(1, char('A' + (hit - choices.begin()))));
            }
        }
        items.push_back(std::move(it));
    }
    return items;
}

}  // namespace

std::vector<eval_item> load_milebench(const fs::path & dir) {
    if (fs::exists(dir / (dir.filename().string() + ".json"))) {
        return load_task(dir);
    }
    std::vector<fs::path> tasks;
    for (const auto & e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (e.is_directory() && fs::exists(e.path() / (name + ".json"))) {
            tasks.push_back(e.path());
        }
    }
    if (tasks.empty()) {
        throw error(dir.string() + ": no MileBench task (expected <task>/<task>.json, e.g. " +
                    (dir / "TextNeedleInAHaystack" / "TextNeedleInAHaystack.json").string() + ")");
    }
    std::sort(tasks.begin(), tasks.end());
    std::vector<eval_item> items;
    for (const fs::path & t : tasks) {
        std::vector<eval_item> part = load_task(t);
        std::move(part.begin(), part.end(), std::back_inserter(items));
    }
    return items;
}

}  // namespace ecokv::detail
