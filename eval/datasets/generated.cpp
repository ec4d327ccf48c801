// ecokv eval: the generated suite, our own items for the tiny vision-language models (written by the data
// generator, one JSON object per line), scored with exact match.
//
// Layout: <dir>/items.jsonl, lines {"image": [paths relative to <dir>] (or one path; [] for text-only),
// "question", "answers" (a non-empty list of strings, or one string), "type", optional "context", optional
// "id"}. Blank lines are skipped; other keys are ignored.
// Choices:
// - Without "id" the item id is the 1-based line number ("7"), stable as long as the file is only appended to.
// - A duplicate "id" is an error naming both lines.
#include "datasets/dataset-impl.h"
#include "ecokv/error.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>

namespace ecokv::detail {

std::vector<eval_item> load_generated(const fs::path & dir) {
    const fs::path path = dir / "items.jsonl";
    if (!fs::exists(path)) {
        throw error(path.string() + ": no such file");
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        throw error(path.string() + ": cannot open: " + std::strerror(errno));
    }
    std::vector<eval_item>        items;
    std::map<std::string, size_t> line_of;  // id -> line
    std::string                   line;
    for (size_t line_no = 1; std::getline(in, line); ++line_no) {
        if (line.find_first_not_of(" \t\r\n") == std::string::npos) {
            continue;
        }
        const std::string where = path.string() + ":" + std::to_string(line_no);
        const json        e     = parse_json_line(line, where);
        if (!e.is_object()) {
            throw error(where + ": expected a JSON object, not " + e.type_name());
        }
        eval_item it;
        it.id = e.contains("id") ? string_member(e, "id", where, true) : std::to_string(line_no);
        if (const auto [at, fresh] = line_of.emplace(it.id, line_no); !fresh) {
            throw error(where + ": duplicate id '" + it.id + "' (first on line " + std::to_string(at->second) + ")");
        }
        for (const std::string & p : strings_member(e, "image", where)) {
            it.images.push_back(resolve_image(dir, p, where));
        }
        if (e.contains("context")) {
            it.context = string_member(e, "context", where);
        }
        it.question = string_member(e, "question", where);
        it.answers  = answers_member(e, "answers", where);
        it.type     = string_member(e, "type", where);
        items.push_back(std::move(it));
    }
    if (in.bad()) {
        throw error(path.string() + ": read failed");
    }
    return items;
}

}  // namespace ecokv::detail
