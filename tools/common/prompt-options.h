// The model and prompt options of the commands that prefill one prompt in llama.cpp (ecokv run, ecokv analyze),
// declared once: --model, --mmproj, --image, -p/--prompt, -f/--file, --question, --verbose and the engine options
// (ecokv/llama-options.h: -c, -t, --batch-size, -ub, -fa, -ctk, -ctv, --image-max-tokens). Without --model and
// without any prompt, the bundled tiny-qwen2vl reads its sample receipt and is asked the page's questions (the
// README's main job); with a prompt but no --model, the bundled tiny-vlm answers.
#pragma once

#include "ecokv/datasets.h"
#include "ecokv/llama-session.h"

#include <cxxopts.hpp>

#include <string>
#include <vector>

namespace ecokv::tools {

struct prompt_options {
    llama::session_options   session;
    std::string              text;  // the prompt, or the context in question mode, with one media marker per image
    std::vector<std::string> images, questions;
    bool                     main_job = false;  // nothing given: the bundled sample page and its questions
    std::vector<eval_item>   sample;            // main job: the page's questions with their answers
};

// question_help says what --question does in this command (run answers the questions; analyze only needs the mode).
void add_prompt_options(cxxopts::Options & options, const std::string & question_help);

// Reads and checks the options of add_prompt_options (and sets llama.cpp's log level from --verbose).
prompt_options prompt_options_from(const cxxopts::ParseResult & args);

}  // namespace ecokv::tools
