// The coco-caption tokenizer: pycocoevalcap/tokenizer/ptbtokenizer.py runs Stanford CoreNLP 3.4.1's PTBTokenizer
// with -preserveLines -lowerCase on each caption ('\n' read as ' '), then drops the tokens in PUNCTUATIONS:
//   '' ' `` ` -LRB- -RRB- -LCB- -RCB- . ? ! , : - -- ... ;
// CoreNLP lower-cases a token after escaping it, so brackets come out as -lrb- -rrb- -lcb- -rcb- and are NOT in
// that (upper-case) list: pycocoevalcap keeps them, and so does this.
//
// This is a re-implementation of the PTBLexer.flex rules that decide token boundaries (longest match, ties to
// the earlier rule, on the original case): words and hyphenated "things", numbers with . : , inside, slashes
// (and/or, 1/2), acronyms and the listed abbreviations with their period (u.s., mr., etc., no.), a single letter
// with its period (a.), contractions split off ("it's" -> it 's, "don't" -> do n't, "cannot" -> can not),
// URLs ending in com/net/org/edu or starting with www., [?!]+ as one token, hyphen runs, ellipses, quotes
// (" and ' become `` '' ` ' and are dropped), brackets, currency and other symbols as single tokens, '|' '\' and
// control characters deleted.
// Deviations (rare in captions): no e-mail, phone-number, SGML-entity or spaced-fraction rules, no
// americanize (CoreNLP 3.4.1 rewrites e.g. "colour" to "color"), escaped '/' and '*' are left unescaped (a
// one-to-one renaming, invisible to the metrics), and characters CoreNLP deletes as untokenizable are taken
// from coarse Unicode ranges.
#include "metric-impl.h"
#include "metrics/text.h"

#include <algorithm>
#include <array>

namespace ecokv {

namespace {

using namespace detail;

bool is_apos(char32_t c) {  // APOS
    return c == U'\'' || c == 0x92 || c == 0x2019;
}
bool is_apos_etc(char32_t c) {  // APOSETCETERA
    return is_apos(c) || c == 0x91 || c == 0x2018 || c == 0x201B;
}
bool is_quote(char32_t c) {  // the characters of QUOTES, plus '
    return c == U'\'' || c == U'`' || (c >= 0x91 && c <= 0x94) || (c >= 0x2018 && c <= 0x201F) || c == 0x2039 ||
           c == 0x203A || c == 0xAB || c == 0xBB;
}

enum class kind { space, deleted, letter, symbol, other };

// Non-letters of PTBLexer: what it skips, what it deletes as untokenizable, and its MISCSYMBOL-like characters.
kind classify(char32_t c) {
    if (py_isspace(c) || c == 0x200B || c == 0x200E || c == 0x200F || c == 0xFEFF) {
        return kind::space;
    }
    if (c < 0x80) {
        if (c < 0x20 || c == 0x7F || c == U'|' || c == U'\\') {
            return kind::deleted;
        }
        return is_ascii_alpha(c) || is_ascii_digit(c) ? kind::letter : kind::other;
    }
    if (c >= 0x10000 || (c >= 0xD800 && c <= 0xF8FF) || (c >= 0xFE00 && c <= 0xFE0F)) {
        return kind::deleted;  // JFlex 1.4 reads UTF-16 units: no astral letters; surrogates, private use
    }
    if (is_quote(c) || c == 0x80 || c == 0x85 || c == 0x96 || c == 0x97 || (c >= 0x2013 && c <= 0x2015) ||
        c == 0x2026) {
        return kind::other;
    }
    if ((c >= 0x80 && c <= 0x9F) ||
        (c >= 0x2000 && c <= 0x206F && !(c >= 0x2020 && c <= 0x2023) && !(c >= 0x2030 && c <= 0x2038) && c != 0x2044 &&
         c != 0x2010 && c != 0x2011) ||
        (c >= 0x2400 && c <= 0x25FF) || (c >= 0x2700 && c <= 0x2BFF) || (c >= 0x3001 && c <= 0x303F && c != 0x3012)) {
        return kind::deleted;
    }
    if ((c >= 0xA1 && c <= 0xBF && c != 0xAA && c != 0xAD) || c == 0xD7 || c == 0xF7 || (c >= 0x2010 && c <= 0x2011) ||
        (c >= 0x2020 && c <= 0x2023) || (c >= 0x2030 && c <= 0x2038) || (c >= 0x2044 && c <= 0x2044) ||
        (c >= 0x2070 && c <= 0x23FF) || (c >= 0x2600 && c <= 0x26FF) || c == 0x3012 || c == 0x30FB ||
        (c >= 0xFF01 && c <= 0xFF0F) || (c >= 0xFF1A && c <= 0xFF20) || (c >= 0xFF3B && c <= 0xFF40) ||
        (c >= 0xFF5B && c <= 0xFF65)) {
        return kind::symbol;
    }
    return kind::letter;
}

bool is_letter(char32_t c) {  // [:letter:], with the ASCII digits kept apart
    return classify(c) == kind::letter && !is_ascii_digit(c);
}
bool is_alnum(char32_t c) {
    return classify(c) == kind::letter;
}
bool is_ascii_alnum(char32_t c) {
    return is_ascii_alpha(c) || is_ascii_digit(c);
}

bool iequal(std::u32string_view s, size_t i, std::string_view lit) {  // %caseless literal match at i
    if (i + lit.size() > s.size()) {
        return false;
    }
    for (size_t k = 0; k < lit.size(); ++k) {
        if (py_lower(s[i + k]) != char32_t(lit[k])) {
            return false;
        }
    }
    return true;
}

size_t run(std::u32string_view s, size_t i, bool (*pred)(char32_t)) {
    size_t j = i;
    while (j < s.size() && pred(s[j])) {
        ++j;
    }
    return j - i;
}

// REDAUX = {APOS}([msdMSD]|re|ve|ll): its length at i, or 0.
size_t redaux(std::u32string_view s, size_t i) {
    if (i + 1 >= s.size() || !is_apos(s[i])) {
        return 0;
    }
    const char32_t c = s[i + 1];
    if (c == U'm' || c == U's' || c == U'd' || c == U'M' || c == U'S' || c == U'D') {
        return 2;
    }
    return iequal(s, i + 1, "re") || iequal(s, i + 1, "ve") || iequal(s, i + 1, "ll") ? 3 : 0;
}

// Abbreviations kept with their period (ABBREV1, ABTITLE, ABBREV4 of PTBLexer.flex); matched caselessly except
// the capitalised ones, whose first letter is a character class in the lexer.
bool is_abbreviation(std::u32string_view word) {
    static const std::array<std::string_view, 118> k_caseless = {
        "jan",     "feb",   "mar",  "apr",  "jun",  "jul",    "aug",  "sep",   "sept",  "oct",   "nov",  "dec",
        "mon",     "tue",   "tues", "wed",  "thu",  "thurs",  "fri",  "ala",   "ariz",  "calif", "colo", "conn",
        "dak",     "del",   "fla",  "ga",   "ind",  "kan",    "kans", "ky",    "la",    "md",    "mich", "minn",
        "mo",      "mont",  "neb",  "nev",  "okla", "pa",     "penn", "tenn",  "tex",   "va",    "vt",   "wis",
        "wisc",    "wyo",   "inc",  "co",   "cos",  "corp",   "pty",  "ptys",  "ppty",  "pptys", "ltd",  "plc",
        "bancorp", "dept",  "bhd",  "assn", "univ", "intl",   "sys",  "no",    "nos",   "prop",  "ph",   "tel",
        "est",     "ext",   "sq",   "ft",   "jr",   "sr",     "bros", "blvd",  "rd",    "esq",   "etc",  "al",
        "seq",     "mr",    "mrs",  "ms",   "dr",   "drs",    "prof", "profs", "sen",   "sens",  "rep",  "reps",
        "atty",    "attys", "lt",   "col",  "gen",  "messrs", "gov",  "govs",  "adm",   "rev",   "maj",  "sgt",
        "cpl",     "pvt",   "mt",   "capt", "st",   "ste",    "ave",  "pres",  "lieut", "hon",
    };
    static const std::array<std::string_view, 20> k_caseless2 = {
        "brig", "cmdr", "comdr", "pfc", "spc",   "supt", "supts", "det",  "vs",  "alex",
        "wm",   "jos",  "cie",   "cf",  "treas", "invt", "elec",  "natl", "mfg", "mtg",
    };
    static const std::array<std::string_view, 6> k_capitalised = { "Ark", "Ill", "Mass", "Miss", "Ore", "Wash" };
    const std::string                            lower         = utf8_encode(py_lower(word));
    for (std::string_view a : k_caseless) {
        if (lower == a) {
            return true;
        }
    }
    for (std::string_view a : k_caseless2) {
        if (lower == a) {
            return true;
        }
    }
    for (std::string_view a : k_capitalised) {
        if (char32_t(a[0]) == word[0] && lower.substr(1) == std::string(a.substr(1))) {
            return true;
        }
    }
    return false;
}

struct match {
    size_t         length  = 0;        // for the longest-match rule: trailing context included
    size_t         consume = 0;        // characters taken by the token
    int            rule    = 1 << 20;  // order in PTBLexer.flex: the earlier wins a tie
    std::u32string text;
};

void consider(match & best, size_t length, size_t consume, int rule, std::u32string text) {
    if (length > best.length || (length == best.length && rule < best.rule)) {
        best = { length, consume, rule, std::move(text) };
    }
}

// Every word-like rule that can start at i (letters, digits, a signed or leading-dot number).
match scan_word(std::u32string_view s, size_t i) {
    match        best;
    const size_t n     = s.size();
    const auto   sub   = [&](size_t len) { return std::u32string(s.substr(i, len)); };
    const size_t w     = run(s, i, is_letter);
    const size_t alpha = run(s, i, is_ascii_alpha);

    if (iequal(s, i, "cannot")) {
        consider(best, 6, 3, 0, sub(3));
    }
    if (w > 0 && redaux(s, i + w) > 0) {  // {WORD}/{REDAUX}
        consider(best, w + redaux(s, i + w), w, 1, sub(w));
    }
    if (alpha >= 2 && i + alpha + 1 < n && (s[i + alpha - 1] == U'n' || s[i + alpha - 1] == U'N') &&
        s[i + alpha - 2] != U'n' && s[i + alpha - 2] != U'N' && is_apos_etc(s[i + alpha]) &&
        (s[i + alpha + 1] == U't' || s[i + alpha + 1] == U'T')) {  // {SWORD}/{SREDAUX}
        consider(best, alpha + 2, alpha - 1, 2, sub(alpha - 1));
    }
    if (w > 0) {
        consider(best, w, w, 3, sub(w));
    }
    if (alpha == 1 && i + 1 < n && is_apos_etc(s[i + 1]) && (s[i] == U'n' || s[i] == U'N') && i + 2 < n &&
        (s[i + 2] == U't' || s[i + 2] == U'T')) {  // {SREDAUX}: the n't left by the rule above
        consider(best, 3, 3, 3, U"n't");
    }
    // {APOWORD}: vowel'vowel words (ma'am) and [A-HJ-XZn]'xx... (O'Neil).
    if (w >= 2 && i + w + 1 < n &&
        std::u32string_view(U"aeiouyAEIOUY").find(s[i + w - 1]) != std::u32string_view::npos && is_apos_etc(s[i + w]) &&
        (std::u32string_view(U"aeiou").find(s[i + w + 1]) != std::u32string_view::npos ||
         (s[i + w + 1] >= U'A' && s[i + w + 1] <= U'Z'))) {
        const size_t len = w + 2 + run(s, i + w + 2, is_letter);
        consider(best, len, len, 4, sub(len));
    }
    if (std::u32string_view(U"ABCDEFGHJKLMNOPQRSTUVWXZn").find(s[i]) != std::u32string_view::npos && i + 1 < n &&
        is_apos_etc(s[i + 1]) && run(s, i + 2, is_letter) >= 2) {
        const size_t len = 2 + run(s, i + 2, is_letter);
        consider(best, len, len, 4, sub(len));
    }
    // {LIKELYURL}: www.x.y or x.y.com|net|org|edu, segments of letters, digits, '-' and '_'.
    {
        const auto          seg = [](char32_t c) { return is_ascii_alnum(c) || c == U'-' || c == U'_'; };
        std::vector<size_t> ends;
        size_t              j = i;
        while (true) {
            const size_t b = j;
            while (j < n && seg(s[j])) {
                ++j;
            }
            if (j == b) {
                break;
            }
            ends.push_back(j);
            if (j + 1 < n && s[j] == U'.' && seg(s[j + 1])) {
                ++j;
            } else {
                break;
            }
        }
        for (size_t k = ends.size(); k >= 2; --k) {
            const size_t         start_last = (k >= 2 ? ends[k - 2] + 1 : i);
            const std::u32string last       = py_lower(s.substr(start_last, ends[k - 1] - start_last));
            const bool           tld        = last == U"com" || last == U"net" || last == U"org" || last == U"edu";
            const bool           www        = iequal(s, i, "www.") && k >= 3 && last.size() >= 2 && last.size() <= 4 &&
                             run(last, 0, is_ascii_alpha) == last.size();
            if (tld || www) {
                consider(best, ends[k - 1] - i, ends[k - 1] - i, 5, sub(ends[k - 1] - i));
                break;
            }
        }
    }
    // {NUMBER} = [-+]?{NUM}, NUM = digits, or digits* ([.:,] digits)+.
    {
        size_t j = i + ((s[i] == U'-' || s[i] == U'+') ? 1 : 0);
        j += run(s, j, is_ascii_digit);
        while (j + 1 < n && (s[j] == U'.' || s[j] == U':' || s[j] == U',') && is_ascii_digit(s[j + 1])) {
            j += 1 + run(s, j + 1, is_ascii_digit);
        }
        if (j > i && is_ascii_digit(s[j - 1])) {
            consider(best, j - i, j - i, 7, sub(j - i));
        }
    }
    // {THING3}: alnum(-alpha){0,2} (/ alnum(-alpha){0,2}){1,2}, as in and/or, 1/2, 12/25/2020.
    if (is_ascii_alnum(s[i])) {
        const auto part = [&](size_t j) {
            size_t k = j + run(s, j, is_ascii_alnum);
            if (k == j) {
                return j;
            }
            for (int h = 0; h < 2 && k + 1 < n && s[k] == U'-' && is_ascii_alpha(s[k + 1]); ++h) {
                k += 1 + run(s, k + 1, is_ascii_alpha);
            }
            return k;
        };
        size_t j       = part(i);
        int    slashes = 0;
        while (slashes < 2 && j + 1 < n && s[j] == U'/' && part(j + 1) > j + 1) {
            j = part(j + 1);
            ++slashes;
        }
        if (slashes > 0) {
            consider(best, j - i, j - i, 8, sub(j - i));
        }
    }
    // {ACRO} u.s(.) and abbreviations with their period (ABBREV1/2), single letters included (ABBREV4).
    if (is_ascii_alpha(s[i])) {
        size_t j = i + 1;
        while (j + 1 < n && s[j] == U'.' && is_ascii_alpha(s[j + 1])) {
            j += 2;
        }
        if (j > i + 1) {
            if (j < n && s[j] == U'.') {
                consider(best, j + 1 - i, j + 1 - i, 9, sub(j + 1 - i));
            } else if (j == n || classify(s[j]) == kind::space) {
                consider(best, j - i, j - i, 10, sub(j - i));
            }
        }
        if (i + alpha < n && s[i + alpha] == U'.' && (alpha == 1 || is_abbreviation(s.substr(i, alpha)))) {
            consider(best, alpha + 1, alpha + 1, 9, sub(alpha + 1));
        }
    }
    // {WORD}\./{INSENTP}: "etc.," keeps its period before , ; :
    if (w > 0 && i + w + 1 < n && s[i + w] == U'.' &&
        std::u32string_view(U",;:").find(s[i + w + 1]) != std::u32string_view::npos) {
        consider(best, w + 2, w + 1, 11, sub(w + 1));
    }
    // {HTHING} = [A-Za-z0-9][A-Za-z0-9.,]*(-[A-Za-z0-9]+)+
    if (is_ascii_alnum(s[i])) {
        size_t j = i + 1;
        while (j < n && (is_ascii_alnum(s[j]) || s[j] == U'.' || s[j] == U',')) {
            ++j;
        }
        size_t parts = 0;
        while (j + 1 < n && s[j] == U'-' && is_ascii_alnum(s[j + 1])) {
            j += 1 + run(s, j + 1, is_ascii_alnum);
            ++parts;
        }
        if (parts > 0) {
            consider(best, j - i, j - i, 12, sub(j - i));
        }
    }
    // {THING} = (d'x)? alnum+ ({HYPHEN} (d'x)? alnum+)*, HYPHEN = [-_\u058A\u2010\u2011].
    {
        const auto piece = [&](size_t j) {
            // The prefix d' (o', l') counts only before at least two letters or digits: d'x is d, then 'x.
            if (j + 2 < n && std::u32string_view(U"dDoOlL").find(s[j]) != std::u32string_view::npos &&
                is_apos_etc(s[j + 1]) && run(s, j + 2, is_alnum) >= 2) {
                j += 2;
            }
            return j + run(s, j, is_alnum);
        };
        size_t j = piece(i);
        if (j > i) {
            while (j + 1 < n && (s[j] == U'-' || s[j] == U'_' || s[j] == 0x58A || s[j] == 0x2010 || s[j] == 0x2011)) {
                const size_t k = piece(j + 1);
                if (k == j + 1) {
                    break;
                }
                j = k;
            }
            consider(best, j - i, j - i, 13, sub(j - i));
        }
    }
    // {THINGA} = [A-Z]+([+&][A-Z]+)+ (AT&T), {DOLSIGN} = [A-Z]*\$ (US$).
    {
        const auto upper = [](char32_t c) { return c >= U'A' && c <= U'Z'; };
        size_t     j     = i + run(s, i, upper);
        if (j > i) {
            size_t k = j;
            while (k + 1 < n && (s[k] == U'&' || s[k] == U'+') && upper(s[k + 1])) {
                k += 1 + run(s, k + 1, upper);
            }
            if (k > j) {
                consider(best, k - i, k - i, 14, sub(k - i));
            }
            if (j < n && s[j] == U'$') {
                consider(best, j + 1 - i, j + 1 - i, 8, sub(j + 1 - i));
            }
        }
    }
    return best;
}

// Quotes and apostrophes: contractions left by scan_word ('s 're ...), the APOWORDs that start with one, the
// quote turned into ` before a word, and QUOTES.
match scan_quote(std::u32string_view s, size_t i) {
    match        best;
    const size_t n = s.size();
    // QUOTES, converted as latexQuotes(tok, probablyLeft = false).
    {
        // QUOTES = {APOS} | '' | [`\u2018-\u201F\u0091-\u0094\u2039\u203A\u00AB\u00BB]{1,2}:
        // an ASCII ' pairs only with itself.
        const bool pair = i + 1 < n && (s[i] == U'\'' ? s[i + 1] == U'\'' : (is_quote(s[i + 1]) && s[i + 1] != U'\''));
        const size_t   len = pair ? 2 : 1;
        std::u32string text;
        for (size_t k = i; k < i + len; ++k) {
            const char32_t c = s[k];
            if (c == U'\'' || c == 0x92 || c == 0x2019 || c == 0x203A) {
                text += U"'";
            } else if (c == 0x91 || c == 0x2018 || c == 0x201B || c == 0x2039 || c == U'`') {
                text += U"`";
            } else if (c == 0x93 || c == 0x201C || c == 0xAB) {
                text += U"``";
            } else if (c == 0x94 || c == 0x201D || c == 0xBB) {
                text += U"''";
            } else {
                text.push_back(c);
            }
        }
        consider(best, len, len, 60, text);
    }
    // '/[A-Za-z][^ \t\n\r\u00A0]: an opening quote
    if (s[i] == U'\'' && i + 2 < n && is_ascii_alpha(s[i + 1]) &&
        std::u32string_view(U" \t\n\r\u00A0").find(s[i + 2]) == std::u32string_view::npos) {
        consider(best, 3, 1, 50, U"`");
    }
    if (const size_t r = redaux(s, i); r > 0) {
        std::u32string text(1, U'\'');  // a curly apostrophe reads as ' (latexQuotes)
        text.append(s.substr(i + 1, r - 1));
        if (i + r >= n || !is_ascii_alpha(s[i + r])) {  // {REDAUX}/[^A-Za-z]
            consider(best, r + (i + r < n ? 1 : 0), r, 40, text);
        } else {
            consider(best, r, r, 55, text);
        }
    }
    if (is_apos(s[i])) {  // APOWORDs and TBSPEC2 that open with an apostrophe
        for (std::string_view tail : { "n'", "n", "em", "cause", "till", "til", "twas" }) {
            if (iequal(s, i + 1, tail) && (tail != "n'" || is_apos(s[i + 2]))) {
                const size_t len = 1 + tail.size();
                consider(best, len, len, 4, std::u32string(s.substr(i, len)));
            }
        }
        if (i + 3 < n && s[i + 1] >= U'2' && s[i + 1] <= U'9' && s[i + 2] == U'0' &&
            (s[i + 3] == U's' || s[i + 3] == U'S')) {
            consider(best, 4, 4, 4, std::u32string(s.substr(i, 4)));
        }
    }
    return best;
}

// Punctuation and symbols: one token each, with PTB's escapes and normalisations.
match scan_symbol(std::u32string_view s, size_t i) {
    const size_t   n        = s.size();
    const char32_t c        = s[i];
    const auto     same_run = [&](char32_t ch) {
        size_t j = i;
        while (j < n && s[j] == ch)
            ++j;
        return j - i;
    };
    switch (c) {
        case U'"': return { 1, 1, 0, U"''" };
        case U'(':
        case U'[': return { 1, 1, 0, U"-LRB-" };
        case U')':
        case U']':
        case U'>': return { 1, 1, 0, U"-RRB-" };
        case U'{': return { 1, 1, 0, U"-LCB-" };
        case U'}': return { 1, 1, 0, U"-RCB-" };
        case U'<': {  // {SGML} = <\/?[A-Za-z!][^>]*>, else a bracket
            size_t j = i + 1 + (i + 1 < n && s[i + 1] == U'/' ? 1 : 0);
            if (j < n && (is_ascii_alpha(s[j]) || s[j] == U'!')) {
                const size_t close = s.find(U'>', j);
                if (close != std::u32string_view::npos) {
                    return { close + 1 - i, close + 1 - i, 0, std::u32string(s.substr(i, close + 1 - i)) };
                }
            }
            return { 1, 1, 0, U"-LRB-" };
        }
        case U'-': {  // {HYPHENS}: 3 or 4 become the PTB dash "--"
            const size_t len = same_run(U'-');
            return { len, len, 0, len >= 3 && len <= 4 ? U"--" : std::u32string(s.substr(i, len)) };
        }
        case U'.': {  // {LDOTS} and single periods: all filtered out
            const size_t len = same_run(U'.');
            return { len, len, 0, len >= 3 ? U"..." : U"." };
        }
        case U'?':
        case U'!': {
            size_t j = i;
            while (j < n && (s[j] == U'?' || s[j] == U'!')) {
                ++j;
            }
            return { j - i, j - i, 0, std::u32string(s.substr(i, j - i)) };
        }
        case U'*':
        case U'@':
        case U'#':
        case U'_': {
            const size_t len = same_run(c);
            return { len, len, 0, std::u32string(s.substr(i, len)) };
        }
        case 0x85:
        case 0x2026: return { 1, 1, 0, U"..." };
        case 0x96:
        case 0x97:
        case 0x2013:
        case 0x2014:
        case 0x2015: return { 1, 1, 0, U"--" };
        case 0xA2: return { 1, 1, 0, U"cents" };
        case 0xA3: return { 1, 1, 0, U"#" };
        case 0x80:
        case 0xA4:
        case 0x20A0:
        case 0x20AC: return { 1, 1, 0, U"$" };
        case 0xBC: return { 1, 1, 0, U"1/4" };
        case 0xBD: return { 1, 1, 0, U"1/2" };
        case 0xBE: return { 1, 1, 0, U"3/4" };
        default: return { 1, 1, 0, std::u32string(1, c) };
    }
}

bool filtered(const std::u32string & tok) {
    static const std::array<std::u32string_view, 13> k_punct = { U"''", U"'", U"``", U"`",  U".",   U"?", U"!",
                                                                 U",",  U":", U"-",  U"--", U"...", U";" };
    return std::find(k_punct.begin(), k_punct.end(), std::u32string_view(tok)) != k_punct.end();
}

}  // namespace

std::vector<std::string> metrics::ptb_tokenize(std::string_view caption) {
    std::u32string s;
    for (char32_t c : utf8_decode(caption)) {
        if (c != 0xAD) {  // removeSoftHyphens
            s.push_back(c == U'\n' ? U' ' : c);
        }
    }
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size();) {
        const kind k = classify(s[i]);
        if (k == kind::space || k == kind::deleted) {
            ++i;
            continue;
        }
        const bool signed_number =
            (s[i] == U'-' || s[i] == U'+' || s[i] == U'.') && i + 1 < s.size() && is_ascii_digit(s[i + 1]);
        match m;
        if (k == kind::letter || signed_number) {
            m = scan_word(s, i);
        } else if (is_quote(s[i])) {
            m = scan_quote(s, i);
        } else {
            m = scan_symbol(s, i);
        }
        if (m.consume == 0) {  // cannot happen: every branch takes a character; guard against a stall
            m = { 1, 1, 0, std::u32string(1, s[i]) };
        }
        i += m.consume;
        const std::u32string tok = py_lower(m.text);  // -lowerCase applies after escaping: -LRB- -> -lrb-
        if (!filtered(tok)) {
            out.push_back(utf8_encode(tok));
        }
    }
    return out;
}

}  // namespace ecokv
