// ecokv: the exception type of the library (error), the kinds of it a caller tells apart, and how messages name an
// option.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace ecokv {

// Thrown for every user-facing failure: bad options, bad files, bad shapes, non-finite data.
// The message names the option, file or tensor at fault. Tools catch it once, print it and exit 1.
class error : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

// Keys, values or queries that are NaN or infinite. From a file, the file is at fault; from an engine, the model
// computed them (corrupt weights?), which the adapter says.
class non_finite_error : public error {
  public:
    using error::error;
};

// An option that is wrong: `key` is its table key (ecokv/options.h); what() spells it as the command line does
// ("--budget 4 must be larger than --window 4 ..."), so that a front end with other spellings
// (kv_compression.budget) can name it.
class option_error : public error {
  public:
    option_error(std::string key, const std::string & message) : error(message), key(std::move(key)) {}
    std::string key;
};

// How messages name the option of table key `key`: "--budget", the row's flag, from the option table (so that the
// core names an option by its row, never by a spelling of its own). Throws option_error for an unknown key.
std::string option_name(std::string_view key);

}  // namespace ecokv
