// ecokv eval: the JSON Lines reader of scored items and the JSON form of a result.
#include "ecokv/error.h"
#include "ecokv/metrics.h"
#include "datasets/dataset-impl.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace ecokv {

namespace {

using json = nlohmann::json;

bool blank(const std::string & line) {
    return line.find_first_not_of(" \t\r\n") == std::string::npos;
}

metric_item parse_item(const std::string & line, const std::string & where, bool needs_type) {
    json j;
    try {
        j = json::parse(line);
    } catch (const json::parse_error & e) {
        // nlohmann's message starts "[json.exception.parse_error.101] parse error at line 1, column 5: ...";
        // keep the part after the position, the line number is ours.
        const std::string what = e.what();
        const size_t      col  = what.find("column ");
        throw error(where + ": invalid JSON" + (col == std::string::npos ? "" : " at " + what.substr(col)));
    } catch (const json::out_of_range & e) {
        throw error(where + ": " + detail::number_out_of_range(e, line, false));
    }
    if (!j.is_object()) {
        throw error(where + ": expected a JSON object");
    }
    metric_item it;
    const auto  pred = j.find("prediction");
    if (pred == j.end()) {
        throw error(where + ": missing \"prediction\"");
    }
    if (!pred->is_string()) {
        throw error(where + ": \"prediction\" must be a string");
    }
    it.prediction = pred->get<std::string>();

    const auto answers = j.find("answers");
    if (answers == j.end()) {
        throw error(where + ": missing \"answers\"");
    }
    if (answers->is_string()) {
        it.answers.push_back(answers->get<std::string>());
    } else if (answers->is_array() && !answers->empty()) {
        for (const json & a : *answers) {
            if (!a.is_string()) {
                throw error(where + ": \"answers\" must hold strings only");
            }
            it.answers.push_back(a.get<std::string>());
        }
    } else {
        throw error(where + ": \"answers\" must be a non-empty array of strings (or one string)");
    }

    const auto type = j.find("type");
    if (type != j.end()) {
        if (!type->is_string()) {
            throw error(where + ": \"type\" must be a string");
        }
        it.type = type->get<std::string>();
    }
    if (needs_type && it.type.empty()) {
        throw error(where + (type == j.end() ? ": missing \"type\"" : ": empty \"type\"") +
                    " (the metric needs each item's question type)");
    }
    return it;
}

}  // namespace

std::vector<metric_item> read_metric_items(const std::string & path, std::string_view name) {
    const bool    needs_type = !name.empty() && find_metric(name).needs_type;
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        throw error(path + ": cannot open: " + std::strerror(errno));
    }
    std::vector<metric_item> items;
    std::string              line;
    for (size_t line_no = 1; std::getline(in, line); ++line_no) {
        if (!blank(line)) {
            items.push_back(parse_item(line, path + ":" + std::to_string(line_no), needs_type));
        }
    }
    if (in.bad()) {
        throw error(path + ": read failed");
    }
    if (items.empty()) {
        throw error(path + ": no items (expected one JSON object per line)");
    }
    return items;
}

std::string metric_result_json(const metric_result & r) {
    nlohmann::ordered_json j;
    j["metric"] = r.metric;
    j["score"]  = r.score;
    j["n"]      = r.n;
    if (r.correct) {
        j["correct"] = *r.correct;
    }
    if (!r.by_type.empty()) {
        nlohmann::ordered_json by = nlohmann::ordered_json::object();
        for (const auto & [type, g] : r.by_type) {
            by[type] = { { "score", g.score }, { "correct", g.correct }, { "n", g.n } };
        }
        j["by_type"] = by;
    }
    return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace ecokv
