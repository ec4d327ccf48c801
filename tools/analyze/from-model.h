// ecokv analyze on a model and a prompt (the options of ecokv run): prefill in llama.cpp, then analyse the capture.
#pragma once

#include "ecokv/capture.h"
#include "ecokv/method.h"

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#include <functional>

namespace ecokv::tools {

// Prefills the prompt of the options (its context in question mode) with what `needs` asks of the capture, then calls
// `analyse` with the capture and a description of the input: the model, the prompt's cells, and per image its file
// and where each image chunk's tokens lie ({"path", "image", "part", "n_parts", "first_cell", "rows", "cols"}; tiled
// projectors make several chunks of one image).
void with_model_capture(const cxxopts::ParseResult & args, const method_requirements & needs,
                        const std::function<void(const capture_view &, const nlohmann::json &)> & analyse);

}  // namespace ecokv::tools
