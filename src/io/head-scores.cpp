#include "io/head-scores.h"

#include "impl.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ecokv {

std::vector<double> read_head_scores(const std::string & path, int32_t n_layers, int32_t n_heads) {
    if (path.empty()) {
        ECOKV_THROW("sparsemm needs --head-scores FILE (the official SparseMM head-score JSON)");
    }
    std::ifstream in(path);
    if (!in) {
        ECOKV_THROW("%s: cannot open head-score file", path.c_str());
    }
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception & e) {
        ECOKV_THROW("%s: not valid JSON: %s", path.c_str(), e.what());
    }
    if (!j.is_object()) {
        ECOKV_THROW("%s: expected an object {\"layer-head\": [scores]}", path.c_str());
    }
    std::vector<double> out;
    double              total = 0;
    for (int32_t il = 0; il < n_layers; ++il) {
        for (int32_t h = 0; h < n_heads; ++h) {
            const std::string key = std::to_string(il) + "-" + std::to_string(h);
            const auto        it  = j.find(key);
            if (it == j.end()) {
                ECOKV_THROW("%s: no entry \"%s\"; the file must cover %d layers x %d query heads", path.c_str(),
                            key.c_str(), n_layers, n_heads);
            }
            if (!it->is_array() || it->empty()) {
                ECOKV_THROW("%s: entry \"%s\" must be a non-empty list of scores", path.c_str(), key.c_str());
            }
            double sum = 0;
            for (const auto & v : *it) {
                if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) {
                    ECOKV_THROW("%s: entry \"%s\" holds %s, expected non-negative numbers", path.c_str(),
                                key.c_str(), v.dump().c_str());
                }
                sum += v.get<double>();
            }
            out.push_back(sum / double(it->size()));
            total += out.back();
        }
    }
    if (!(total > 0)) {
        ECOKV_THROW("%s: all head scores are zero", path.c_str());
    }
    return out;
}

}  // namespace ecokv
