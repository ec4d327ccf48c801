// JSON text of what may hold a model's output: bytes that are not UTF-8 (an answer cut inside a character, a token of
// a byte-level vocabulary) become U+FFFD, nlohmann's replacement, instead of an exception while writing.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace ecokv::tools {

inline std::string json_text(const nlohmann::json & j, int indent = -1) {
    return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ecokv::tools
