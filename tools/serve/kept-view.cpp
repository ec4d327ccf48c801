#include "kept-view.h"

#include <llama.h>

namespace ecokv::serve {

using json = nlohmann::json;

cell_map describe_cells(const llama::session & s, const llama::prompt & p) {
    cell_map out{ p.images(), std::vector<std::string>(size_t(p.n_cells())) };
    const std::vector<uint64_t> & units = p.units();
    for (size_t i = 0; i < units.size(); ++i) {
        if (p.cells_before(i + 1) - p.cells_before(i) == 1 && (units[i] >> 63) == 0) {  // a text token
            out.pieces[size_t(p.cells_before(i))] = s.detokenize({ llama_token(units[i]) });
        }
    }
    return out;
}

json kept_json(const llama::session & s, const std::vector<std::vector<int32_t>> & kept, int32_t n_decoded,
               const cell_map & cells, const std::vector<llama_token> & decoded, uint64_t bytes_kept,
               uint64_t bytes_full) {
    const int32_t n_layers = llama_model_n_layer(s.model()), n_kv_heads = llama_model_n_head_kv(s.model());
    const int32_t n_cells  = int32_t(cells.pieces.size() + decoded.size());
    // Cells numbered from the last compression on are held by every head (kept_cells lists what it kept).
    const int32_t      first_new = kept.empty() ? 0 : n_cells - n_decoded;
    std::vector<int32_t> counts(size_t(n_cells), 0);
    json                 heads = kept.empty() ? json() : json::array(), entries = json::array();
    for (size_t h = 0; h < size_t(n_layers * n_kv_heads); ++h) {
        int32_t held = n_cells;
        if (!kept.empty()) {
            for (const int32_t c : kept[h]) {
                ++counts[size_t(c)];
            }
            if (h % size_t(n_kv_heads) == 0) {
                heads.push_back(json::array());
            }
            heads.back().push_back(kept[h]);
            held = int32_t(kept[h].size()) + n_cells - first_new;
        }
        entries.push_back(held);
    }
    for (int32_t c = first_new; c < n_cells; ++c) {
        counts[size_t(c)] += n_layers * n_kv_heads;
    }
    json images = json::array();
    for (const llama::media_grid & g : cells.images) {
        images.push_back({ { "first_cell", g.first_cell }, { "rows", g.n_rows }, { "cols", g.n_cols },
                           { "image", g.image }, { "part", g.part }, { "n_parts", g.n_parts } });
    }
    json pieces = cells.pieces;
    for (const llama_token t : decoded) {
        pieces.push_back(s.detokenize({ t }));
    }
    return { { "n_layers", n_layers },
             { "n_kv_heads", n_kv_heads },
             { "n_cells", n_cells },
             { "compressed", !kept.empty() },
             { "first_new_cell", first_new },
             { "images", images },
             { "pieces", pieces },
             { "counts", counts },
             { "heads", heads },
             { "entries_per_head", entries },
             { "bytes_kept", bytes_kept },
             { "bytes_full", bytes_full } };
}

}  // namespace ecokv::serve
