// Selection output (SPEC §8) and the merged rows of merge methods.
#include "ecokv/compress.h"
#include "ecokv/safetensors.h"
#include "impl.h"

#include <cstring>
#include <nlohmann/json.hpp>

namespace ecokv {

void write_selection_json(const std::string & path, const selection & sel) {
    nlohmann::json layers = nlohmann::json::array();
    for (const auto & layer : sel.layers) {
        nlohmann::json heads = nlohmann::json::array();
        for (const head_selection & h : layer) {
            heads.push_back(h.kept);
        }
        layers.push_back({ { "heads", std::move(heads) } });
    }
    const nlohmann::json out = {
        { "method", sel.method },
        { "budget", sel.budget },
        { "window", sel.window },
        { "n_tokens", sel.n_tokens },
        { "kv_bytes_full", sel.kv_bytes_full },
        { "kv_bytes_kept", sel.kv_bytes_kept },
        { "layers", std::move(layers) },
    };
    write_file_atomic(path, out.dump() + "\n");
}

void write_merged_rows(const std::string & path, const selection & sel) {
    safetensors_writer w;
    for (size_t il = 0; il < sel.layers.size(); ++il) {
        for (size_t ig = 0; ig < sel.layers[il].size(); ++ig) {
            const head_selection & h = sel.layers[il][ig];
            if (h.keys.empty() && !h.kept.empty()) {
                ECOKV_THROW("%s: the selection has no merged rows (use --merge pivot)", path.c_str());
            }
            const int64_t n = int64_t(h.kept.size());
            const std::string p = "layers." + std::to_string(il) + ".heads." + std::to_string(ig) + ".";
            auto bytes = [](const std::vector<float> & v) {
                std::vector<std::byte> b(v.size() * sizeof(float));
                std::memcpy(b.data(), v.data(), b.size());
                return b;
            };
            w.add(p + "keys", dtype::f32, { n, n ? int64_t(h.keys.size()) / n : 0 }, bytes(h.keys));
            w.add(p + "values", dtype::f32, { n, n ? int64_t(h.values.size()) / n : 0 }, bytes(h.values));
        }
    }
    w.set_metadata("method", sel.method);
    w.write(path);
}

}  // namespace ecokv
