// ecokv tools: llama.cpp's engine options (ecokv/llama-options.h) as flags, for the commands that run a model (run,
// analyze, eval, serve, the benches).
#pragma once

#include "common/args.h"
#include "ecokv/llama-session.h"

namespace ecokv::tools {

// The engine options as flags in the group "engine", showing the defaults of `defaults` (give engine_options_from
// the same).
void add_engine_options(cxxopts::Options & options, const llama::session_options & defaults = {});

// The engine flags given, set on `base`.
llama::session_options engine_options_from(const cxxopts::ParseResult & args, llama::session_options base = {});

// llama.cpp's multi-letter single-dash spellings (-ub, -fa, -ctk, -ctv, -ngl, -dev) and their long flags, for
// parse_options.
flag_aliases engine_aliases();

// parse_options with the engine aliases; with --list-devices (add_engine_options declares it) prints the devices as
// llama.cpp does and gives nullopt, as --help does.
std::optional<cxxopts::ParseResult> parse_engine_command(cxxopts::Options & options, int argc, char ** argv);

}  // namespace ecokv::tools
