// ecokv eval internals: the reader of each dataset, as the registry (registry.cpp) lists them, and the JSON
// helpers they share (json-io.cpp). Every helper throws ecokv::error with the `where` it is given, which names
// the file and the entry ("/data/val.json: data[3]") or line ("/data/items.jsonl:4").
#pragma once

#include "ecokv/datasets.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

namespace ecokv::detail {

namespace fs = std::filesystem;
using json   = nlohmann::json;

// Each reader takes the absolute, normalised dataset directory. Image existence, id uniqueness and a non-empty
// result are checked by load_dataset() for all of them.
using dataset_fn = std::vector<eval_item> (*)(const fs::path & dir);

std::vector<eval_item> load_ocrbench(const fs::path & dir);
std::vector<eval_item> load_chartqa(const fs::path & dir);
std::vector<eval_item> load_textvqa(const fs::path & dir);
std::vector<eval_item> load_docvqa(const fs::path & dir);
std::vector<eval_item> load_textcaps(const fs::path & dir);
std::vector<eval_item> load_mpdocvqa(const fs::path & dir);
std::vector<eval_item> load_milebench(const fs::path & dir);
std::vector<eval_item> load_generated(const fs::path & dir);
std::vector<eval_item> load_niah(const fs::path & dir);

// The whole file as JSON. Throws "<path>: no such file", "<path>: cannot open: <reason>" or
// "<path>:<line>: invalid JSON at column <c>: <what>".
json read_json(const fs::path & path);

// Parses one line of a JSON Lines file; `where` is "<path>:<line>".
json parse_json_line(const std::string & line, const std::string & where);

// The array root[key] ("data" in the VQA layouts); throws "<path>: missing \"data\"" or "... must be an array".
const json & array_member(const json & root, const char * key, const std::string & where);

// obj[key]; throws "<where>: missing \"key\"" (also when obj is not an object: "<where>: expected an object").
const json & member(const json & obj, const char * key, const std::string & where);

// obj[key] as a string; a number is taken in its JSON spelling where `number_ok` (ids, numeric labels).
std::string string_member(const json & obj, const char * key, const std::string & where, bool number_ok = false);

// obj[key] as answers: a non-empty array of strings, or one string taken as the only answer.
std::vector<std::string> answers_member(const json & obj, const char * key, const std::string & where);

// obj[key] as a list of strings (may be empty); one string is taken as a one-element list.
std::vector<std::string> strings_member(const json & obj, const char * key, const std::string & where);

// "<path>: data[<i>]": the name of entry i of an array in messages (0-based, as data[i] in Python or jq).
std::string entry_where(const fs::path & path, const char * array, size_t i);

// The items made by fn(entry, where) from every element of the JSON array `member` of the file `path`.
template <typename Fn> std::vector<eval_item> map_entries(const fs::path & path, const char * member, Fn && fn) {
    const json             root = read_json(path);
    const json &           data = array_member(root, member, path.string());
    std::vector<eval_item> items;
    for (size_t i = 0; i < data.size(); ++i) {
        items.push_back(fn(data[i], entry_where(path, member, i)));
    }
    return items;
}

// dir / rel, normalised; `rel` must be relative and stay inside dir (no "..").
std::string resolve_image(const fs::path & dir, const std::string & rel, const std::string & where,
                          const char * what = "image path");

// The message for a JSON number beyond a double ("12: number 1e309 is out of range (beyond a double)"), its line
// in `text` first when with_line: nlohmann's out_of_range.406 carries no position.
std::string number_out_of_range(const json::out_of_range & e, const std::string & text, bool with_line);

// The first of `names` that exists in dir; throws "<dir>: none of a.json, b.json" when none does.
fs::path find_file(const fs::path & dir, const std::vector<std::string> & names);

}  // namespace ecokv::detail
