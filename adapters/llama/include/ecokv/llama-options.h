// ecokv-llama: llama.cpp's options of a session as data, one row per option with llama.cpp's own name and meaning
// (common/arg.cpp of llama.cpp 0.5.0): context size, threads, batch sizes, flash attention, cache types, mtmd's image
// size. The command line builds its flags from the rows (llama.cpp's spellings, -ub and -ctk included), eval records
// those that change results in config.json, and session_options holds the values. A new engine option is one row in
// engine-options.cpp and one field of session_options.
#pragma once

#include "ecokv/llama-session.h"
#include "ecokv/options.h"

#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ecokv::llama {

struct engine_option : option_spec {
    // llama.cpp's single-dash spelling of more than one letter ("-ub", "-ctk"); cxxopts takes one letter only, so the
    // command line rewrites it to the long flag before parsing.
    std::string_view alias;
    option_record    record;  // whether eval's config.json records it (never: it changes no result)
    option_value (*get)(const engine_option &, const session_options &);
    void (*set)(const engine_option &, session_options &, const option_value &);  // a checked value
};

// Every engine option, in table order.
std::span<const engine_option> engine_options();

// The KV cache types ecokv compresses, llama.cpp's list for -ctk/-ctv (common/arg.cpp): f32, f16, bf16, q8_0, q4_0,
// q4_1, iq4_nl, q5_0, q5_1.
std::span<const ggml_type> cache_types();

// Converts and checks `value` (checked_value) and sets the option; throws option_error naming it.
void set_engine_option(session_options & o, std::string_view key, const option_value & value);

// How messages name the engine option of table key `key`: "--cache-type-k", the row's flag (as option_name does for
// the compression options). Throws option_error for an unknown key.
std::string engine_option_name(std::string_view key);

// The option's value in o ("auto" for flash_attn); throws option_error for an unknown key.
option_value get_engine_option(const session_options & o, std::string_view key);

// The options that change results, as eval's config.json records them: rows recorded always, and those recorded
// unless_default whose value differs from session_options{}'s.
std::vector<std::pair<std::string, option_value>> recorded_engine_options(const session_options & o);

}  // namespace ecokv::llama
