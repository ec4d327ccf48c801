// THE list of compression options (ecokv/options.h): one row per option. The command line's flags, the server's
// kv_compression fields, eval's config.json and compression::key() all read it; ranges are checked here only.
#include "ecokv/options.h"

#include "impl.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

namespace ecokv {

namespace {

constexpr double k_int_max = std::numeric_limits<int32_t>::max();
constexpr double k_inf     = std::numeric_limits<double>::infinity();
constexpr double k_int64_max = 9.2e18;  // below 2^63: any value within converts to int64_t exactly enough

// The field a pointer to member names: a method parameter, or a member of the compression itself (chunk).
template <class T, class C> C member_class(T C::*);
template <auto M> auto & field(compression & c) {
    if constexpr (std::is_same_v<decltype(member_class(M)), compression>) {
        return c.*M;
    } else {
        return c.params.*M;
    }
}
template <auto M> const auto & field(const compression & c) { return field<M>(const_cast<compression &>(c)); }

// Accessors by kind. Optional fields hold a negative value when the method's default applies.
template <auto M> option_value get_int(const option_info &, const compression & c) { return int64_t(field<M>(c)); }
template <auto M> option_value get_opt_int(const option_info &, const compression & c) {
    return field<M>(c) < 0 ? option_value{} : option_value{ int64_t(field<M>(c)) };
}
template <auto M> void set_int(const option_info &, compression & c, const option_value & v) {
    field<M>(c) = std::remove_reference_t<decltype(field<M>(c))>(std::get<int64_t>(v));
}
template <auto M> option_value get_real(const option_info &, const compression & c) { return field<M>(c); }
template <auto M> option_value get_opt_real(const option_info &, const compression & c) {
    return field<M>(c) < 0 ? option_value{} : option_value{ field<M>(c) };
}
template <auto M> void set_real(const option_info &, compression & c, const option_value & v) {
    field<M>(c) = std::get<double>(v);
}
// Choices are listed in the order of their enum's values.
template <auto M> option_value get_choice(const option_info & o, const compression & c) {
    return std::string(o.choices[size_t(field<M>(c))]);
}
template <auto M> void set_choice(const option_info & o, compression & c, const option_value & v) {
    const auto at = std::find(o.choices.begin(), o.choices.end(), std::get<std::string>(v));
    field<M>(c)   = std::remove_reference_t<decltype(field<M>(c))>(at - o.choices.begin());
}
template <auto M> option_value get_path(const option_info &, const compression & c) {
    return field<M>(c).empty() ? option_value{} : option_value{ field<M>(c) };
}
template <auto M> void set_path(const option_info &, compression & c, const option_value & v) {
    field<M>(c) = std::get<std::string>(v);
}
option_value get_method(const option_info &, const compression & c) { return c.spec.name(); }
void set_method(const option_info &, compression & c, const option_value & v) {
    c.spec = parse_method(std::get<std::string>(v));
}

using option_kind::choice, option_kind::integer, option_kind::method, option_kind::number, option_kind::path;
using option_record::always, option_record::never, option_record::unless_default;
constexpr unsigned k_m = scope_method, k_p = scope_prefill, k_d = scope_decode, k_t = scope_turns;

const std::vector<option_info> & table() {
    // Columns: {key, short name, kind, lo, hi, lo_open, choices, unset, help}, scope, record, client, get, set.
    // clang-format off
    static const std::vector<option_info> rows = {
        { { "method", 'm', method, 0, 0, false, {}, "", "ALLOCATOR+SCORER, a scorer or an allocator (see --list-methods)" },
          k_m, never, true, get_method, set_method },
        { { "budget", 'b', integer, 1, k_int_max, false, {}, "", "tokens kept per KV head, window included" },
          k_m, never, true, get_int<&method_params::budget>, set_int<&method_params::budget> },
        { { "window", 0, integer, 1, k_int_max, false, {}, "the scorer's", "observation window N" },
          k_m, always, true, get_opt_int<&method_params::window>, set_int<&method_params::window> },
        { { "kernel", 0, integer, 1, k_int_max, false, {}, "", "pooling kernel (odd)" },
          k_m, always, true, get_int<&method_params::kernel>, set_int<&method_params::kernel> },
        { { "pool", 0, choice, 0, 0, false, { "avg", "max" }, "", "pooling" },
          k_m, always, true, get_choice<&method_params::pool>, set_choice<&method_params::pool> },
        { { "alpha", 0, number, 0, 1, false, {}, "", "ECOKV: Euclidean weight in the diversity" },
          k_m, always, true, get_real<&method_params::alpha>, set_real<&method_params::alpha> },
        { { "beta", 0, number, 0, 1, false, {}, "", "ECOKV: rE weight in the redundancy" },
          k_m, always, true, get_real<&method_params::beta>, set_real<&method_params::beta> },
        { { "tau", 0, number, 0, k_inf, false, {}, "", "ECOKV: rE temperature (0: sqrt(head_dim))" },
          k_m, always, true, get_real<&method_params::tau>, set_real<&method_params::tau> },
        { { "centroid", 0, choice, 0, 0, false, { "all", "prefix" }, "", "ECOKV/MixKV/KeyDiff centroid over" },
          k_m, always, true, get_choice<&method_params::centroid>, set_choice<&method_params::centroid> },
        { { "mixkv_scale", 0, choice, 0, 0, false, { "attention", "importance" }, "",
            "MixKV: diversity matched to mean attention (the official code) or to mean importance (ECOKV App. A.1)" },
          k_m, unless_default, true, get_choice<&method_params::mixkv_scale>, set_choice<&method_params::mixkv_scale> },
        { { "ecokv_weights", 0, choice, 0, 0, false, { "equations", "figure3" }, "",
            "ECOKV: alpha and beta weight the Euclidean terms (Eq. 3/6) or the cosine ones (Figure 3's text)" },
          k_m, unless_default, true, get_choice<&method_params::ecokv_weights>, set_choice<&method_params::ecokv_weights> },
        { { "floor_ratio", 0, number, 0, 1, false, {}, "adakv 0.2, sparsemm 0.1, madakv 0.2",
            "AdaKV/MadaKV floor, SparseMM uniform part" },
          k_m, always, true, get_opt_real<&method_params::floor_ratio>, set_real<&method_params::floor_ratio> },
        { { "pyramid_beta", 0, integer, 1, k_int_max, false, {}, "", "PyramidKV shape" },
          k_m, always, true, get_int<&method_params::pyramid_beta>, set_int<&method_params::pyramid_beta> },
        { { "theta", 0, number, 0, 1, true, {}, "", "MadaKV: attention mass a head's demand covers" },
          k_m, always, true, get_real<&method_params::theta>, set_real<&method_params::theta> },
        { { "sinks", 0, integer, 0, k_int_max, false, {}, "", "StreamingLLM: leading tokens kept" },
          k_m, always, true, get_int<&method_params::n_sink>, set_int<&method_params::n_sink> },
        { { "head_scores", 0, path, 0, 0, false, {}, "none", "SparseMM head-score JSON (official format)" },
          k_m, always, false, get_path<&method_params::head_scores>, set_path<&method_params::head_scores> },
        { { "seed", 0, integer, 0, k_int64_max, false, {}, "", "random scorer seed" },
          k_m, always, true, get_int<&method_params::seed>, set_int<&method_params::seed> },
        { { "merge", 0, choice, 0, 0, false, { "none", "pivot" }, "", "merge evicted K/V into kept rows (LOOK-M)" },
          k_m, always, true, get_choice<&method_params::merge>, set_choice<&method_params::merge> },
        { { "chunk", 0, integer, 0, 1 << 24, false, {}, "",
            "prefill N cells at a time, compressing after each chunk: the KV cache never holds more than the budget "
            "plus one chunk per head (0: the whole prompt, then compress)" },
          k_p, unless_default, true, get_int<&compression::chunk>, set_int<&compression::chunk> },
        { { "decode_compress", 0, integer, 0, 1 << 24, false, {}, "",
            "compress again to the budget every N cells decoded after the prompt (questions and answers; the newest "
            "as the window), so that a long answer stays bounded (0: never)" },
          k_d, unless_default, true, get_int<&compression::decode_compress>,
          set_int<&compression::decode_compress> },
        { { "recompress_slack", 0, integer, -1, 1 << 24, false, {}, "",
            "after each answer, compress a conversation again to the budget (its last turn kept whole) when a KV "
            "head holds more than budget + N entries besides that turn (-1: never)" },
          k_t, unless_default, true, get_int<&compression::recompress_slack>,
          set_int<&compression::recompress_slack> },
    };
    // clang-format on
    return rows;
}

// A value as an error message quotes it: cut at 64 bytes (a request may send kilobytes).
std::string quoted_value(const option_value & v) {
    const std::string t   = option_text(v);
    size_t            cut = std::min<size_t>(t.size(), 64);
    while (cut < t.size() && cut > 0 && (uint8_t(t[cut]) & 0xC0) == 0x80) {
        --cut;  // not inside a UTF-8 character: the message goes into JSON error bodies
    }
    return "'" + t.substr(0, cut) + (cut < t.size() ? "..." : "") + "'";
}

std::string name_of(const option_spec & o) { return "--" + o.flag(); }

// Text parsed whole as the row's kind; numbers checked for the kind. Throws option_error.
option_value converted(const option_spec & o, const option_value & v) {
    const std::string * text = std::get_if<std::string>(&v);
    if (o.kind == option_kind::flag) {
        const int64_t * i = std::get_if<int64_t>(&v);
        if ((text && (*text == "true" || *text == "1")) || (i && *i == 1)) {
            return int64_t(1);
        }
        if ((text && (*text == "false" || *text == "0")) || (i && *i == 0)) {
            return int64_t(0);
        }
        throw option_error(std::string(o.key), name_of(o) + " takes no value (or true/false), not " + quoted_value(v));
    }
    if (o.kind == integer && text && std::find(o.choices.begin(), o.choices.end(), *text) != o.choices.end()) {
        return v;  // a word the row takes besides numbers ("auto")
    }
    if (o.kind == choice || o.kind == method || o.kind == path || o.kind == option_kind::text) {
        if (text == nullptr || text->empty()) {
            throw option_error(std::string(o.key), name_of(o) + " must be " +
                                                       (o.kind == choice ? choices_text(o) : "a non-empty string"));
        }
        if (o.kind == choice && std::find(o.choices.begin(), o.choices.end(), *text) == o.choices.end()) {
            throw option_error(std::string(o.key), name_of(o) + " must be " + choices_text(o) + ", not " + quoted_value(v));
        }
        return v;
    }
    double x = 0;
    if (text != nullptr && o.kind == integer && !text->empty()) {  // exact, beyond a double's 53 bits too
        int64_t    i = 0;
        const auto r = std::from_chars(text->data(), text->data() + text->size(), i);
        if (r.ec == std::errc() && r.ptr == text->data() + text->size()) {
            return i;
        }
    }
    if (text != nullptr) {
        const char * end = text->data() + text->size();
        const auto   r   = std::from_chars(text->data(), end, x);
        if (text->empty() || r.ec != std::errc() || r.ptr != end) {
            throw option_error(std::string(o.key), name_of(o) + " " + quoted_value(v) + " is not a number" +
                                                       (o.choices.empty() ? "" : " (nor " + choices_text(o) + ")"));
        }
    } else if (const int64_t * i = std::get_if<int64_t>(&v)) {
        x = double(*i);
    } else if (const double * d = std::get_if<double>(&v)) {
        x = *d;
    } else {
        throw option_error(std::string(o.key), name_of(o) + " needs a value");
    }
    if (!std::isfinite(x)) {
        throw option_error(std::string(o.key), name_of(o) + " " + quoted_value(v) + " is not a finite number");
    }
    if (o.kind == number) {
        return x;
    }
    if (x != std::floor(x)) {
        throw option_error(std::string(o.key), name_of(o) + " " + quoted_value(v) + " is not a whole number");
    }
    if (x < -k_int64_max || x > k_int64_max) {
        throw option_error(std::string(o.key), name_of(o) + " " + quoted_value(v) + " is out of range");
    }
    const int64_t * exact = std::get_if<int64_t>(&v);
    return exact ? *exact : int64_t(x);
}

void check_range(const option_spec & o, const option_value & v) {
    if ((o.kind != integer && o.kind != number) || std::holds_alternative<std::string>(v)) {
        return;
    }
    const double x   = std::holds_alternative<int64_t>(v) ? double(std::get<int64_t>(v)) : std::get<double>(v);
    const bool   low = o.lo_open ? x <= o.lo : x < o.lo;
    if (!low && x <= o.hi) {
        return;
    }
    const std::string lo = option_text(o.kind == integer ? option_value{ int64_t(o.lo) } : option_value{ o.lo });
    const std::string hi = option_text(o.kind == integer ? option_value{ int64_t(o.hi) } : option_value{ o.hi });
    const bool        unbounded = o.hi == k_inf || o.hi == k_int_max || o.hi >= k_int64_max;
    throw option_error(std::string(o.key),
                       name_of(o) + " " + option_text(v) + " must " +
                           (unbounded ? (o.lo_open ? "be larger than " : "be at least ") + lo
                                      : "lie in " + std::string(o.lo_open ? "(" : "[") + lo + ", " + hi + "]"));
}

}  // namespace

std::string choices_text(const option_spec & o) {
    std::string out;
    for (size_t i = 0; i < o.choices.size(); ++i) {
        out += (i == 0 ? "" : i + 1 == o.choices.size() ? " or " : ", ") + std::string(o.choices[i]);
    }
    return out;
}

option_value checked_value(const option_spec & o, const option_value & value) {
    const option_value v = converted(o, value);
    check_range(o, v);
    return v;
}

std::string option_spec::flag() const {
    std::string f(key);
    std::replace(f.begin(), f.end(), '_', '-');
    return f;
}

std::span<const option_info> compression_options() { return table(); }

std::string option_name(std::string_view key) { return name_of(find_option(key)); }

const option_info & find_option(std::string_view key) {
    for (const option_info & o : table()) {
        if (key == o.key || key == o.flag()) {
            return o;
        }
    }
    std::string known;
    for (const option_info & o : table()) {
        known += (known.empty() ? "" : ", ") + std::string(o.key);
    }
    const std::string shown = key.size() > 64 ? std::string(key.substr(0, 64)) + "..." : std::string(key);
    throw option_error("", "unknown option '" + shown + "'; known: " + known);
}

void set_option(compression & c, std::string_view key, const option_value & value) {
    const option_info & o = find_option(key);
    const option_value  v = checked_value(o, value);
    try {
        o.set(o, c, v);
    } catch (const option_error &) {
        throw;
    } catch (const error & e) {  // an unknown method
        throw option_error(std::string(o.key), e.what());
    }
}

option_value get_option(const compression & c, std::string_view key) {
    const option_info & o = find_option(key);
    return o.get(o, c);
}

std::string option_text(const option_value & v) {
    if (const int64_t * i = std::get_if<int64_t>(&v)) {
        return std::to_string(*i);
    }
    if (const double * d = std::get_if<double>(&v)) {
        return detail::format("%g", *d);
    }
    if (const std::string * s = std::get_if<std::string>(&v)) {
        return *s;
    }
    return "";
}

compression compression::none() {
    compression c;
    c.enabled = false;
    return c;
}

std::string compression::name() const { return enabled ? spec.name() : std::string(k_full_cache); }

std::string compression::key() const {
    if (!enabled) {
        return std::string(k_full_cache);
    }
    std::string out = spec.name();
    for (const option_info & o : table()) {
        if (o.kind != method) {
            const option_value v = o.get(o, *this);
            out.append(" ").append(o.key).append("=");
            out.append(std::holds_alternative<std::monostate>(v) ? "-" : option_text(v));
        }
    }
    return out;
}

void compression::validate() const {
    if (!enabled) {
        return;
    }
    params.validate(method_window(spec, params));
    for (const char * key : { "chunk", "decode_compress", "recompress_slack" }) {
        check_range(find_option(key), get_option(*this, key));
    }
    if (chunk > 0) {
        check_chunk(spec, params, chunk);
    }
    if (decode_compress > 0 || recompress_slack >= 0) {
        check_recompression(spec, params, decode_compress);
    }
}

compression compression_named(std::string_view name, compression base) {
    if (is_full_cache(name)) {
        return compression::none();
    }
    set_option(base, "method", std::string(name));
    return base;
}

bool is_full_cache(std::string_view name) { return name == k_full_cache; }

// The table's ranges of every method option, then the rules between options.
void method_params::validate(int32_t n_window) const {
    compression c;
    c.params = *this;
    for (const option_info & o : table()) {
        const option_value v = o.get(o, c);
        if ((o.scope & scope_method) && !std::holds_alternative<std::monostate>(v)) {
            check_range(o, v);
        }
    }
    if (n_window < 1) {
        throw option_error("window",
                           detail::format("%s %d must be at least 1", option_name("window").c_str(), n_window));
    }
    if (budget <= n_window) {
        throw option_error("budget", detail::format("%s %d must be larger than %s %d (the budget includes the window)",
                                                    option_name("budget").c_str(), budget,
                                                    option_name("window").c_str(), n_window));
    }
    if (kernel % 2 == 0) {
        throw option_error("kernel", detail::format("%s %d must be a positive odd number",
                                                    option_name("kernel").c_str(), kernel));
    }
}

}  // namespace ecokv
