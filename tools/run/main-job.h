// ecokv run without options (the README's main job): the bundled tiny-qwen2vl asked every question of its sample
// page by the full cache, by compressed caches and by the full cache of a smaller image at the same KV entries.
#pragma once

#include "common/prompt-options.h"
#include "ecokv/options.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace ecokv::tools {

// A compressed cache of the comparison, with the name it is shown under.
struct main_job_cache {
    std::string label;
    compression how;
};

// Runs the comparison on po.sample (prompt_options::main_job), the smaller image sized to `budget` KV entries per head;
// one JSON object: the page, then per column its answers, their scores and its KV entries.
nlohmann::json main_job(const prompt_options & po, const std::vector<main_job_cache> & caches, int32_t budget,
                        int32_t n_predict);

// The comparison as a table a newcomer reads at a glance.
void print_main_job(const nlohmann::json & out);

}  // namespace ecokv::tools
