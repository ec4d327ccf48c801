// ecokv: the one exception type of the library.
#pragma once

#include <stdexcept>
#include <string>

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

}  // namespace ecokv
