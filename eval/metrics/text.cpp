// ecokv eval internals: Python str semantics (see text.h).
#include "metrics/text.h"

#include <algorithm>
#include <numeric>

namespace ecokv::detail {

std::u32string utf8_decode(std::string_view text) {
    std::u32string out;
    out.reserve(text.size());
    const auto * p = reinterpret_cast<const unsigned char *>(text.data());
    const size_t n = text.size();
    for (size_t i = 0; i < n;) {
        const unsigned char b   = p[i];
        size_t              len = 0;
        char32_t            c   = 0;
        if (b < 0x80) {
            out.push_back(b);
            ++i;
            continue;
        }
        if (b >= 0xC2 && b <= 0xDF) {
            len = 2, c = b & 0x1F;
        } else if (b >= 0xE0 && b <= 0xEF) {
            len = 3, c = b & 0x0F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            len = 4, c = b & 0x07;
        }
        bool ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; ++k) {
            ok = (p[i + k] & 0xC0) == 0x80;
            c  = (c << 6) | (p[i + k] & 0x3F);
        }
        // Overlong forms, surrogates and values past U+10FFFF are invalid as well.
        ok = ok && !(len == 3 && c < 0x800) && !(len == 4 && c < 0x10000) && !(c >= 0xD800 && c <= 0xDFFF) &&
             c <= 0x10FFFF;
        if (ok) {
            out.push_back(c);
            i += len;
        } else {
            out.push_back(0xDC00 + b);
            ++i;
        }
    }
    return out;
}

std::string utf8_encode(std::u32string_view text) {
    std::string out;
    out.reserve(text.size());
    for (char32_t c : text) {
        if (c >= 0xDC80 && c <= 0xDCFF) {  // an escaped invalid byte goes back as it came
            out.push_back(char(c - 0xDC00));
        } else if (c < 0x80) {
            out.push_back(char(c));
        } else if (c < 0x800) {
            out.push_back(char(0xC0 | (c >> 6)));
            out.push_back(char(0x80 | (c & 0x3F)));
        } else if (c < 0x10000) {
            out.push_back(char(0xE0 | (c >> 12)));
            out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
            out.push_back(char(0x80 | (c & 0x3F)));
        } else {
            out.push_back(char(0xF0 | (c >> 18)));
            out.push_back(char(0x80 | ((c >> 12) & 0x3F)));
            out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
            out.push_back(char(0x80 | (c & 0x3F)));
        }
    }
    return out;
}

bool py_isspace(char32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_ascii_digit(char32_t c) {
    return c >= '0' && c <= '9';
}

bool is_ascii_alpha(char32_t c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

char32_t py_lower(char32_t c) {
    if (c < 0x80) {
        return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    }
    if ((c >= 0xC0 && c <= 0xDE && c != 0xD7) || (c >= 0x391 && c <= 0x3AB && c != 0x3A2) ||
        (c >= 0x410 && c <= 0x42F) || (c >= 0xFF21 && c <= 0xFF3A)) {
        return c + 32;
    }
    if ((c >= 0x100 && c <= 0x137 && c != 0x130) || (c >= 0x14A && c <= 0x177) || (c >= 0x460 && c <= 0x481) ||
        (c >= 0x48A && c <= 0x4BF)) {
        return c | 1;  // upper case at even code points, lower case right after
    }
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) {
        return (c & 1) ? c + 1 : c;  // upper case at odd code points here
    }
    if (c >= 0x400 && c <= 0x40F) {
        return c + 80;
    }
    switch (c) {
        case 0x130: return 'i';  // Python gives 'i' + U+0307; the combining dot is dropped
        case 0x178: return 0xFF;
        case 0x386: return 0x3AC;
        case 0x388:
        case 0x389:
        case 0x38A: return c + 37;
        case 0x38C: return 0x3CC;
        case 0x38E:
        case 0x38F: return c + 63;
        default: return c;
    }
}

std::u32string py_lower(std::u32string_view s) {
    std::u32string out(s);
    for (char32_t & c : out) {
        c = py_lower(c);
    }
    return out;
}

std::u32string py_strip(std::u32string_view s) {
    size_t b = 0, e = s.size();
    while (b < e && py_isspace(s[b])) {
        ++b;
    }
    while (e > b && py_isspace(s[e - 1])) {
        --e;
    }
    return std::u32string(s.substr(b, e - b));
}

std::vector<std::u32string> py_split(std::u32string_view s) {
    std::vector<std::u32string> out;
    size_t                      i = 0;
    while (i < s.size()) {
        while (i < s.size() && py_isspace(s[i])) {
            ++i;
        }
        const size_t b = i;
        while (i < s.size() && !py_isspace(s[i])) {
            ++i;
        }
        if (i > b) {
            out.emplace_back(s.substr(b, i - b));
        }
    }
    return out;
}

std::u32string join(const std::vector<std::u32string> & words, char32_t sep) {
    std::u32string out;
    for (size_t i = 0; i < words.size(); ++i) {
        if (i) {
            out.push_back(sep);
        }
        out += words[i];
    }
    return out;
}

bool contains(std::u32string_view s, std::u32string_view part) {
    return s.find(part) != std::u32string_view::npos;
}

std::u32string replace_all(std::u32string_view s, std::u32string_view from, std::u32string_view to) {
    std::u32string out;
    size_t         i = 0;
    for (size_t hit; (hit = s.find(from, i)) != std::u32string_view::npos; i = hit + from.size()) {
        out.append(s.substr(i, hit - i));
        out.append(to);
    }
    out.append(s.substr(i));
    return out;
}

size_t levenshtein(std::u32string_view a, std::u32string_view b) {
    std::vector<size_t> row(b.size() + 1);  // one row of the DP table: distances from a[0, i) to each prefix of b
    std::iota(row.begin(), row.end(), size_t(0));
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diag = row[0];
        row[0]      = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t up = row[j];
            row[j]          = std::min({ row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1) });
            diag            = up;
        }
    }
    return row[b.size()];
}

std::u32string u32(std::string_view ascii) {
    return std::u32string(ascii.begin(), ascii.end());
}

}  // namespace ecokv::detail
