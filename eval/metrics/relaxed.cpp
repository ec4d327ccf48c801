// relaxed: ChartQA relaxed accuracy (Masry et al., ACL Findings 2022, arXiv:2203.10244, end of §5.1).
//
// Reproduces relaxed_correctness() in lmms-eval lmms_eval/tasks/chartqa/utils.py, itself taken from Qwen-VL
// eval_mm/evaluate_vqa.py#L113, and Qwen-VL's evaluate_relaxed_accuracy(), which strips the prediction and takes
// the max over the annotations:
//   - _to_float: Python float(text); a text ending in '%' is float(text.rstrip('%')) / 100;
//   - if the prediction is a number and the target a non-zero number (NaN counts as non-zero, as in Python's
//     truth test): correct when |pred - target| / |target| <= 0.05;
//   - otherwise (including a target of 0): prediction.lower() == target.lower().
// Deliberate deviations: Python's float() also reads non-ASCII decimal digits; only the Arabic-Indic,
// Devanagari, Bengali and fullwidth ones are read here. lower() is text.h's.
#include "metric-impl.h"
#include "metrics/text.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

namespace ecokv {

namespace {

using namespace detail;

// A decimal digit Python's float() accepts, as its ASCII value; -1 for anything else.
int decimal_value(char32_t c) {
    for (char32_t zero :
         { U'0', char32_t(0x660), char32_t(0x6F0), char32_t(0x966), char32_t(0x9E6), char32_t(0xFF10) }) {
        if (c >= zero && c <= zero + 9) {
            return int(c - zero);
        }
    }
    return -1;
}

// digitpart: digit (["_"] digit)*; appends the digits (no underscores) to `out` and returns the end, or `i`.
size_t digit_part(const std::u32string & s, size_t i, std::string & out) {
    if (i >= s.size() || decimal_value(s[i]) < 0) {
        return i;
    }
    out.push_back(char('0' + decimal_value(s[i++])));
    while (i < s.size()) {
        const size_t j = (s[i] == U'_') ? i + 1 : i;
        if (j >= s.size() || decimal_value(s[j]) < 0) {
            break;
        }
        out.push_back(char('0' + decimal_value(s[j])));
        i = j + 1;
    }
    return i;
}

}  // namespace

std::optional<double> metrics::python_float(std::string_view text) {
    const std::u32string s    = py_strip(utf8_decode(text));
    size_t               i    = 0;
    double               sign = 1;
    if (i < s.size() && (s[i] == U'+' || s[i] == U'-')) {
        sign = s[i++] == U'-' ? -1 : 1;
    }
    const std::u32string rest = py_lower(s.substr(i));
    if (rest == U"inf" || rest == U"infinity") {
        return sign * HUGE_VAL;
    }
    if (rest == U"nan") {
        return std::nan("");
    }
    // [digitpart] "." digitpart | digitpart ["."], then an optional exponent.
    std::string  mant;
    size_t       j     = digit_part(s, i, mant);
    const size_t n_int = mant.size();
    if (j < s.size() && s[j] == U'.') {
        mant.push_back('.');
        const size_t k = digit_part(s, j + 1, mant);
        if (n_int == 0 && k == j + 1) {
            return std::nullopt;  // "." alone
        }
        j = k;
    } else if (n_int == 0) {
        return std::nullopt;
    }
    std::string exp;
    if (j < s.size() && (s[j] == U'e' || s[j] == U'E')) {
        size_t k = j + 1;
        if (k < s.size() && (s[k] == U'+' || s[k] == U'-')) {
            exp.push_back(char(s[k++]));
        }
        const size_t before = exp.size();
        k                   = digit_part(s, k, exp);
        if (exp.size() == before) {
            return std::nullopt;
        }
        j = k;
    }
    if (j != s.size()) {
        return std::nullopt;
    }
    const std::string number = mant + (exp.empty() ? "" : "e" + exp);
    double            value  = 0;
    const auto        res    = std::from_chars(number.data(), number.data() + number.size(), value);
    if (res.ec == std::errc::result_out_of_range) {
        // Past the double range Python gives inf (overflow) or 0.0 (underflow): tell them apart by the decimal
        // exponent of the first significant digit.
        std::string digits = mant;
        std::erase(digits, '.');
        const size_t first = digits.find_first_not_of('0');
        long         e10   = exp.empty() ? 0 : std::strtol(exp.c_str(), nullptr, 10);
        if (first != std::string::npos) {
            e10 += long(n_int) - 1 - long(first);
        }
        value = e10 > 0 ? HUGE_VAL : 0.0;
    }
    return sign * value;
}

bool metrics::relaxed_correctness(std::string_view prediction, std::string_view target) {
    const auto to_float = [](const std::u32string & text) -> std::optional<double> {
        if (!text.empty() && text.back() == U'%') {
            size_t e = text.size();
            while (e > 0 && text[e - 1] == U'%') {
                --e;
            }
            const auto v = python_float(utf8_encode(std::u32string_view(text).substr(0, e)));
            return v ? std::optional<double>(*v / 100.0) : std::nullopt;
        }
        return python_float(utf8_encode(text));
    };
    const std::u32string pred = py_strip(utf8_decode(prediction));
    const std::u32string targ = utf8_decode(target);
    const auto           p    = to_float(pred);
    const auto           t    = to_float(targ);
    if (p && t && *t != 0.0) {
        return std::fabs(*p - *t) / std::fabs(*t) <= 0.05;
    }
    return py_lower(pred) == py_lower(targ);
}

double metrics::relaxed_accuracy(std::string_view prediction, std::span<const std::string> answers) {
    for (const std::string & a : answers) {
        if (relaxed_correctness(prediction, a)) {
            return 1.0;
        }
    }
    return 0.0;
}

metric_result detail::score_relaxed(std::span<const metric_item> items) {
    return mean_over_items(items,
                           [](const metric_item & it) { return metrics::relaxed_accuracy(it.prediction, it.answers); });
}

}  // namespace ecokv
