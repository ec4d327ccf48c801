// ecokv tools: flags shared by several subcommands, declared once, and the one place errors become exit codes.
#pragma once

#include "ecokv/options.h"

#include <cxxopts.hpp>

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ecokv::tools {

// The compression options of the table (ecokv/options.h) as flags, in the group "method": every row in `scopes`
// (option_scope bits) but those in `skip`, which the command takes another way (eval: --methods, --budgets). Help
// comes from the rows, the defaults shown from `defaults` (give compression_from the same); with method_default
// false --method shows none (compress needs it given).
void add_compression_options(cxxopts::Options & options, unsigned scopes, const compression & defaults = {},
                             std::initializer_list<std::string_view> skip = {}, bool method_default = true);

// The flags of add_compression_options that were given, set on `base` with the table's setters (errors as the
// table words them); not validated: the caller validates once everything is set.
compression compression_from(const cxxopts::ParseResult & args, compression base = {});

// Parses argv, each word equal to an alias's first rewritten to its second (llama.cpp's multi-letter single-dash
// flags, engine-flags.h): nullopt after printing --help (the general, method and engine groups); a stray positional
// argument is an error.
using flag_aliases = std::vector<std::pair<std::string, std::string>>;
std::optional<cxxopts::ParseResult> parse_options(cxxopts::Options & options, int argc, char ** argv,
                                                  const flag_aliases & aliases = {});

// A table row as a flag of `group`: its help says its choices and what applies when it is left out; its default
// (when not empty) is shown. Every flag's value is text, converted by the table's setter.
void add_flag(cxxopts::Options & options, const std::string & group, const option_spec & o,
              const std::string & default_text);

// Sets each row of `rows` whose flag was given on `target`, with set(target, key, text): the table's setter.
template <class Row, class Target, class Set>
void apply_flags(const cxxopts::ParseResult & args, std::span<const Row> rows, Target & target, Set set) {
    for (const Row & o : rows) {
        if (args.count(o.flag())) {
            set(target, o.key, args[o.flag()].template as<std::string>());
        }
    }
}

// -t/--threads: 0 (every core) to 512; anything else is an error naming the option.
int32_t threads_from(const cxxopts::ParseResult & args);

// An integer option within [lo, hi], else an error naming it and the range.
int32_t int_in_range(const cxxopts::ParseResult & args, const char * name, int32_t lo, int32_t hi);

// "a,b,,c" -> {"a", "b", "c"}
std::vector<std::string> split_list(const std::string & s);

// Throws ecokv::error("missing --NAME") when a required flag is absent.
void require(const cxxopts::ParseResult & args, std::initializer_list<const char *> names);

// Throws ecokv::error naming the first stray argument (cxxopts ignores positional arguments silently).
void reject_positional(const cxxopts::ParseResult & args);

// Runs a subcommand body: ecokv::error and flag errors print "ecokv NAME: error: ..." and return 1.
int run_command(const char * name, const std::function<int()> & body);

}  // namespace ecokv::tools
