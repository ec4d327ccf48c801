// ecokv: what a KV cache is compressed with, as one value (`compression`), and its options as data: one table row per
// option (key, kind, range, default, help, setter). The command line builds its flags from the rows, the server
// applies a request's kv_compression pairs with the same setter, eval records the rows in config.json, and `key()`
// names a compression canonically. A new option is one row in src/options.cpp.
#pragma once

#include "ecokv/error.h"
#include "ecokv/method.h"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace ecokv {

// The full cache's name in method lists and result records ("full"): no compression.
inline constexpr std::string_view k_full_cache = "full";

// A method with its parameters, or none (the full cache), and how an engine applies it.
struct compression {
    bool          enabled = true;              // false: the full cache; spec and params are then ignored
    method_spec   spec    = default_method();  // the registry's default method
    method_params params;
    int32_t       chunk = 0;                   // chunked prefill: cells per chunk (0: the whole prompt, then compress)
    int32_t       decode_compress  = 0;        // compress again every N cells decoded after the prompt (0: never)
    int32_t       recompress_slack = -1;       // a conversation over budget + slack entries besides its last turn is
                                               // compressed again after each answer (-1: never)

    static compression none();  // the full cache
    // "full" or the canonical method name ("uniform+ecokv").
    std::string name() const;
    // Canonical and stable: "full", or the method's name then every option of the table as key=value in table
    // order ("uniform+ecokv budget=64 window=- ... chunk=0"; "-" where the method's default applies). Two
    // compressions with the same key compress alike.
    std::string key() const;
    // Every range of the table, then the rules between options (budget > window, a chunk or a decode-compress
    // period larger than the window, no h2o chunked or compressed again). Throws option_error naming the option. A
    // disabled compression is always valid.
    void validate() const;
};

// "full" -> compression::none(); anything else a method name (parse_method) on `base`'s options.
compression compression_named(std::string_view name, compression base = {});
bool        is_full_cache(std::string_view name);

// option_error (an option that is wrong, by its table key) and option_name() are in ecokv/error.h.

enum class option_kind {
    integer,  // whole number within [lo, hi]
    number,   // real number within [lo, hi] (lo excluded when lo_open)
    choice,   // one of `choices`
    method,   // a method name (parse_method)
    path,     // a file on the machine that runs the compression
    text,     // free text the row's setter checks (a device list)
    flag,     // present or not: "true"/"false" (or 1/0); on the command line a flag without a value
};

// Where an option applies: to every compression of a capture, or only where an engine prefills the prompt.
enum option_scope : unsigned {
    scope_method  = 1u << 0,  // ecokv compress, analyze, run, eval, serve, the benches
    scope_prefill = 1u << 1,  // run, eval, serve, bench-prefill (chunk)
    scope_decode  = 1u << 2,  // run, eval, serve: compression while an answer grows the cache (decode_compress)
    scope_turns   = 1u << 3,  // serve: compression between the turns of a conversation (recompress_slack)
};

// How eval's config.json records an option (results depend on every option recorded).
enum class option_record {
    always,
    unless_default,  // only when it differs from the default: directories written before the option existed resume
    never,           // method and budget: each result record names its own
};

// A value as a front end holds it: unset (the method's default applies), a whole number, a real one, or text
// (command-line text is converted by set_option to the row's kind).
using option_value = std::variant<std::monostate, int64_t, double, std::string>;

// What an option is, whatever it sets: its name, kind, range and help. The engine adapter's table (llama.cpp's
// options) is made of the same descriptions.
struct option_spec {
    std::string_view              key;         // JSON and config.json key; the flag is --key with '-' for '_'
    char                          short_name;  // 'm', 'b', or 0
    option_kind                   kind;
    double                        lo, hi;      // integer and number rows
    bool                          lo_open;     // number rows: lo excluded
    std::vector<std::string_view> choices;     // choice rows, in the order of the enum they set; integer rows:
                                               // words taken besides numbers ("auto", "all"), kept as text
    std::string_view              unset;       // what applies when the option is not given (window: "the scorer's")
    std::string_view              help;

    std::string flag() const;  // "floor-ratio"
};

// A choice row's choices as the help and errors list them: "avg or max", "on, off or auto".
std::string choices_text(const option_spec & o);

// `value` converted to the option's kind (text parsed whole: "64", "0.8") and checked against its range or
// choices; throws option_error naming the option.
option_value checked_value(const option_spec & o, const option_value & value);

// A compression option: its description and where it applies.
struct option_info : option_spec {
    unsigned      scope;   // option_scope bits
    option_record record;
    bool          client;  // a server's client may set it (false: files on the server's machine)
    option_value (*get)(const option_info &, const compression &);
    void (*set)(const option_info &, compression &, const option_value &);  // a checked value
};

// Every option, in table order.
std::span<const option_info> compression_options();
// The row of `key` (also found by its flag spelling, "floor-ratio"); throws option_error listing the known keys.
const option_info & find_option(std::string_view key);

// Converts `value` to the row's kind (text is parsed whole: "64", "0.8"), checks its range or choices and sets it.
// Throws option_error naming the option: unknown key, wrong kind, out of range, unknown method or choice.
void set_option(compression & c, std::string_view key, const option_value & value);
// The option's value in c (monostate when unset), and as text ("64", "0.8", "avg"; "" when unset).
option_value get_option(const compression & c, std::string_view key);
std::string  option_text(const option_value & v);

}  // namespace ecokv
