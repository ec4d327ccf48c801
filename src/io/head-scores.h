// ecokv internals: SparseMM's official visual head-score JSON ({"l-h": [per-sample scores], ...}).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ecokv {

// Mean score of every (layer, query head), index l * n_heads + h. Every entry of the model must be present
// (extra entries are ignored); throws ecokv::error naming the file and the entry on any problem.
std::vector<double> read_head_scores(const std::string & path, int32_t n_layers, int32_t n_heads);

}  // namespace ecokv
