#include "analyze/from-model.h"

#include "common/prompt-options.h"
#include "ecokv/llama-session.h"

#include <filesystem>

namespace ecokv::tools {

void with_model_capture(const cxxopts::ParseResult & args, const method_requirements & needs,
                        const std::function<void(const capture_view &, const nlohmann::json &)> & analyse) {
    const prompt_options   o = prompt_options_from(args);
    const llama::session   s(o.session);
    const llama::prompt_parts parts = o.questions.empty() ? llama::prompt_parts{ s.chat_prompt(o.text), "" }
                                                         : s.split_prompt(o.text);
    const llama::prompt    p   = s.make_prompt(parts.context, o.images);
    const llama::sequence  seq = s.prefill(p, 0, needs);
    nlohmann::json         images = nlohmann::json::array();
    for (size_t i = 0; i < p.images().size(); ++i) {
        const llama::media_grid & g = p.images()[i];
        images.push_back({ { "path", o.images.at(size_t(g.image)) },  // as given: relative to where ecokv ran
                           { "image", g.image },
                           { "part", g.part },  // tiled projectors: the tiles row-major, then the overview
                           { "n_parts", g.n_parts },
                           { "first_cell", g.first_cell },
                           { "rows", g.n_rows },
                           { "cols", g.n_cols } });
    }
    const nlohmann::json source = { { "input", std::filesystem::path(o.session.model_path).filename().string() },
                                    { "question_mode", !o.questions.empty() },
                                    { "images", images } };
    analyse(seq.capture(), source);
}

}  // namespace ecokv::tools
