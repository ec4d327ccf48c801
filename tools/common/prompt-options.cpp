#include "common/prompt-options.h"

#include "common/engine-flags.h"
#include "common/bundled.h"
#include "ecokv/error.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace ecokv::tools {

namespace {

std::string read_text(const std::string & path) {
    std::ifstream in(path);
    if (!in || std::filesystem::is_directory(path)) {
        throw error(path + ": cannot open prompt file");
    }
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

std::vector<std::string> strings(const cxxopts::ParseResult & args, const char * name) {
    return args.count(name) ? args[name].as<std::vector<std::string>>() : std::vector<std::string>{};
}

}  // namespace

void add_prompt_options(cxxopts::Options & options, const std::string & question_help) {
    // clang-format off
    options.add_options()
        ("model", "GGUF model (default: the bundled tiny-vlm.gguf with its mmproj; with no prompt either, the main job on tiny-qwen2vl)", cxxopts::value<std::string>())
        ("mmproj", "multimodal projector GGUF (libmtmd)", cxxopts::value<std::string>())
        ("image", "image file for the prompt (repeatable; placed where the prompt has <__media__>, else first)",
            cxxopts::value<std::vector<std::string>>())
        ("p,prompt", "prompt text (the context in question mode; may be left out with --image)", cxxopts::value<std::string>())
        ("f,file", "read the prompt from a file", cxxopts::value<std::string>())
        ("question", question_help, cxxopts::value<std::vector<std::string>>())
        ("verbose", "show llama.cpp's log");
    // clang-format on
    add_engine_options(options);
}

prompt_options prompt_options_from(const cxxopts::ParseResult & args) {
    prompt_options    o;
    const bool        bundled = args.count("model") == 0;
    const std::string models  = bundled_models_dir();
    const size_t      n_text  = args.count("prompt") + args.count("file");
    o.images                  = strings(args, "image");
    o.questions               = strings(args, "question");
    const bool main_job = bundled && n_text + o.images.size() + o.questions.size() == 0 && !args.count("mmproj");
    if (main_job) {  // the sample is a dataset of the page's questions (vlm/gen_pages.py --all-questions)
        o.main_job = true;
        o.sample   = load_dataset("generated", bundled_file("tiny-qwen2vl-sample"));
        o.images   = o.sample.at(0).images;
        for (const eval_item & it : o.sample) {
            o.questions.push_back(it.question);
        }
    } else if (n_text > 1 || (n_text == 0 && o.images.empty())) {
        throw error("give the prompt with exactly one of -p/--prompt and -f/--file (or only --image)");
    }
    for (const std::string & q : o.questions) {
        if (q.empty()) {
            throw error("--question must not be empty");
        }
    }
    llama::set_verbose(args.count("verbose") > 0);

    o.session            = engine_options_from(args);
    const std::string bundled_model = main_job ? "tiny-qwen2vl" : "tiny-vlm";
    o.session.model_path = bundled ? bundled_file(bundled_model + ".gguf") : args["model"].as<std::string>();
    const std::string mmproj = args.count("mmproj") ? args["mmproj"].as<std::string>()
                               : bundled            ? models + "/" + bundled_model + "-mmproj.gguf"
                                                    : "";
    if (o.images.empty() ? args.count("mmproj") > 0 : mmproj.empty()) {
        throw error("--image needs --mmproj and --mmproj needs at least one --image");
    }
    o.session.mmproj_path = o.images.empty() ? "" : mmproj;
    if (o.session.image_max_tokens > 0 && o.images.empty()) {
        throw error("--image-max-tokens needs at least one --image");
    }
    o.text = llama::with_media_markers(args.count("prompt") ? args["prompt"].as<std::string>()
                                       : args.count("file") ? read_text(args["file"].as<std::string>())
                                                            : std::string(),
                                       o.images.size());
    return o;
}

}  // namespace ecokv::tools
