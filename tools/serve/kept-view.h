// ecokv serve's kv_kept (a request field): which cells of the conversation each (layer, KV head) holds after the
// answer, how many heads hold each cell, the images' token grids and the text tokens' pieces, so that a client (the
// chat page at /) draws the kept patches of every head over the image.
#pragma once

#include "ecokv/llama-session.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace ecokv::serve {

// The prompt's cells as kv_kept shows them.
struct cell_map {
    std::vector<llama::media_grid> images;  // per image chunk: first cell and token grid (rows x cols)
    std::vector<std::string>       pieces;  // per cell: a text token's piece; empty for an image or audio cell
};
cell_map describe_cells(const llama::session & s, const llama::prompt & p);

// The kv_kept object of a conversation after its turn: the prompt's cells, then the `decoded` tokens of the answer.
// kept: the cells each (layer, KV head) keeps (sequence::kept_cells; empty for a full cache), n_decoded of them
// decoded since the last compression; bytes_kept: what the kept conversation takes (usage.kv_bytes_kept); bytes_full:
// what its cells would take uncompressed.
nlohmann::json kept_json(const llama::session & s, const std::vector<std::vector<int32_t>> & kept, int32_t n_decoded,
                         const cell_map & cells, const std::vector<llama_token> & decoded, uint64_t bytes_kept,
                         uint64_t bytes_full);

}  // namespace ecokv::serve
