// ecokv eval internals: the Python str operations the official evaluators use, on UTF-32 strings.
//
// The evaluators are Python 3 scripts, so their strip(), split(), lower() and len() work on code points with
// Unicode whitespace. These helpers do the same, with one simplification: lower() maps ASCII, Latin-1,
// Latin Extended-A, Greek, Cyrillic and fullwidth Latin letters one to one (no final sigma; U+0130 gives a plain
// 'i', without Python's combining dot); other characters are left as they are.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ecokv::detail {

// Invalid UTF-8 bytes decode to U+DC80 + byte (Python's surrogateescape), so decoding is lossless.
std::u32string utf8_decode(std::string_view text);
std::string    utf8_encode(std::u32string_view text);

bool     py_isspace(char32_t c);
bool     is_ascii_digit(char32_t c);
bool     is_ascii_alpha(char32_t c);
char32_t py_lower(char32_t c);

std::u32string              py_lower(std::u32string_view s);
std::u32string              py_strip(std::u32string_view s);
std::vector<std::u32string> py_split(std::u32string_view s);  // str.split() with no separator
std::u32string              join(const std::vector<std::u32string> & words, char32_t sep);

bool           contains(std::u32string_view s, std::u32string_view part);
std::u32string replace_all(std::u32string_view s, std::u32string_view from, std::u32string_view to);

// Levenshtein distance over code points, unit costs for insertion, deletion and substitution (anls, chars).
size_t levenshtein(std::u32string_view a, std::u32string_view b);

// ASCII literal to UTF-32 (for tables of ASCII keys).
std::u32string u32(std::string_view ascii);

}  // namespace ecokv::detail
