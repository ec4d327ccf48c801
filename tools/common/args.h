// ecokv tools: flags shared by several subcommands, declared once, and the one place errors become exit codes.
#pragma once

#include "ecokv/method.h"

#include <cxxopts.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ecokv::tools {

// --method, --budget, --window, --kernel, --pool, --alpha, --beta, --tau, --centroid, --floor-ratio,
// --pyramid-beta, --theta, --sinks, --head-scores, --seed, --merge. --method has no default unless one is given.
void add_method_options(cxxopts::Options & options, const char * default_method = nullptr);

// -t/--threads: 0 (every core) to 512; anything else is an error naming the option.
int32_t threads_from(const cxxopts::ParseResult & args);

// An integer option within [lo, hi], else an error naming it and the range.
int32_t int_in_range(const cxxopts::ParseResult & args, const char * name, int32_t lo, int32_t hi);

// "a,b,,c" -> {"a", "b", "c"}
std::vector<std::string> split_list(const std::string & s);

// add_method_options (default_method), then parses argv: nullopt after printing --help (the general and method
// groups); a stray positional argument is an error.
std::optional<cxxopts::ParseResult> parse_with_method_options(cxxopts::Options & options, int argc, char ** argv,
                                                              const char * default_method);

// Reads the flags of add_method_options into parameters (validated later, with the method's window).
method_params method_params_from(const cxxopts::ParseResult & args);

// Throws ecokv::error("missing --NAME") when a required flag is absent.
void require(const cxxopts::ParseResult & args, std::initializer_list<const char *> names);

// Throws ecokv::error naming the first stray argument (cxxopts ignores positional arguments silently).
void reject_positional(const cxxopts::ParseResult & args);

// Runs a subcommand body: ecokv::error and flag errors print "ecokv NAME: error: ..." and return 1.
int run_command(const char * name, const std::function<int()> & body);

}  // namespace ecokv::tools
