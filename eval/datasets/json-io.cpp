// ecokv eval: the JSON reading shared by the dataset readers, with file, line and entry in every message.
#include "datasets/dataset-impl.h"
#include "ecokv/error.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace ecokv::detail {

namespace {

// nlohmann's message reads "[json.exception.parse_error.101] parse error at line 3, column 5: syntax error ...";
// returns {line, "column 5: syntax error ..."}, or {"", what} when the position is absent.
std::pair<std::string, std::string> split_parse_error(const std::string & what) {
    const size_t at_line = what.find("at line ");
    const size_t comma   = what.find(", ", at_line);
    if (at_line == std::string::npos || comma == std::string::npos) {
        const size_t colon = what.find(": ");
        return { "", colon == std::string::npos ? what : what.substr(colon + 2) };
    }
    return { what.substr(at_line + 8, comma - at_line - 8), what.substr(comma + 2) };
}

std::string read_text(const fs::path & path) {
    std::ifstream in(path, std::ios::binary);
    return { std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>() };
}

}  // namespace

std::string number_out_of_range(const json::out_of_range & e, const std::string & text, bool with_line) {
    // "[json.exception.out_of_range.406] number overflow parsing '1e309'": find that literal in the text.
    const std::string what  = e.what();
    const size_t      open  = what.find('\''), close = what.rfind('\'');
    const std::string token = open != std::string::npos && close > open ? what.substr(open + 1, close - open - 1) : "";
    const size_t      at    = token.empty() ? std::string::npos : text.find(token);
    const std::string line  = at == std::string::npos ? ""
                                                      : std::to_string(1 + std::count(text.begin(), text.begin() + at, '\n'));
    return (with_line && !line.empty() ? line + ": " : "") + "number " + (token.empty() ? "" : token + " ") +
           "is out of range (beyond a double)";
}

json read_json(const fs::path & path) {
    const std::string name = path.string();
    if (!fs::exists(path)) {
        throw error(name + ": no such file");
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        throw error(name + ": cannot open: " + std::strerror(errno));
    }
    try {
        return json::parse(in);
    } catch (const json::parse_error & e) {
        const auto [line, rest] = split_parse_error(e.what());
        throw error(name + (line.empty() ? "" : ":" + line) + ": invalid JSON at " + rest);
    } catch (const json::out_of_range & e) {  // a number beyond double (1e309): nlohmann gives no position
        throw error(name + ":" + number_out_of_range(e, read_text(path), true));
    }
}

json parse_json_line(const std::string & line, const std::string & where) {
    try {
        return json::parse(line);
    } catch (const json::parse_error & e) {
        throw error(where + ": invalid JSON at " + split_parse_error(e.what()).second);
    } catch (const json::out_of_range & e) {
        throw error(where + ": " + number_out_of_range(e, line, false));
    }
}

const json & array_member(const json & root, const char * key, const std::string & where) {
    const json & a = member(root, key, where);
    if (!a.is_array()) {
        throw error(where + ": \"" + key + "\" must be an array, not " + a.type_name());
    }
    return a;
}

const json & member(const json & obj, const char * key, const std::string & where) {
    if (!obj.is_object()) {
        throw error(where + ": expected an object, not " + obj.type_name());
    }
    const auto it = obj.find(key);
    if (it == obj.end()) {
        throw error(where + ": missing \"" + key + "\"");
    }
    return *it;
}

std::string string_member(const json & obj, const char * key, const std::string & where, bool number_ok) {
    const json & v = member(obj, key, where);
    if (v.is_string()) {
        return v.get<std::string>();
    }
    if (number_ok && v.is_number()) {
        return v.dump();
    }
    throw error(where + ": \"" + key + "\" must be a string" + (number_ok ? " or a number" : "") + ", not " +
                v.type_name());
}

std::vector<std::string> strings_member(const json & obj, const char * key, const std::string & where) {
    const json & v = member(obj, key, where);
    if (v.is_string()) {
        return { v.get<std::string>() };
    }
    if (!v.is_array()) {
        throw error(where + ": \"" + key + "\" must be an array of strings, not " + v.type_name());
    }
    std::vector<std::string> out;
    for (size_t i = 0; i < v.size(); ++i) {
        if (!v[i].is_string()) {
            throw error(where + ": \"" + key + "\"[" + std::to_string(i) + "] must be a string, not " +
                        v[i].type_name());
        }
        out.push_back(v[i].get<std::string>());
    }
    return out;
}

std::vector<std::string> answers_member(const json & obj, const char * key, const std::string & where) {
    std::vector<std::string> out = strings_member(obj, key, where);
    if (out.empty()) {
        throw error(where + ": \"" + key + "\" is empty (at least one answer is needed)");
    }
    return out;
}

std::string entry_where(const fs::path & path, const char * array, size_t i) {
    return path.string() + ": " + array + "[" + std::to_string(i) + "]";
}

std::string resolve_image(const fs::path & dir, const std::string & rel, const std::string & where, const char * what) {
    const fs::path p = fs::path(rel).lexically_normal();
    if (rel.empty() || p.is_absolute() || (!p.empty() && *p.begin() == "..")) {
        throw error(where + ": " + what + " '" + rel + "' must be relative to the dataset directory");
    }
    return (dir / p).lexically_normal().string();
}

fs::path find_file(const fs::path & dir, const std::vector<std::string> & names) {
    std::string tried;
    for (const std::string & n : names) {
        if (fs::exists(dir / n)) {
            return dir / n;
        }
        tried += (tried.empty() ? "" : ", ") + n;
    }
    if (names.size() == 1) {
        throw error((dir / names[0]).string() + ": no such file");
    }
    throw error(dir.string() + ": none of " + tried + " found");
}

}  // namespace ecokv::detail
