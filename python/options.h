// Python keyword arguments as the option tables' values (python/module.cpp, python/session.cpp): one conversion for
// the method options of select(), prefill() and compress() and the engine options of Model().
#pragma once

#include "ecokv/options.h"

#include <pybind11/pybind11.h>

#include <string>

namespace ecokv::python {

// A Python value as the table's setters take it: bool as "true"/"false", int, float, else its text.
inline option_value option_value_of(const pybind11::handle & v) {
    if (pybind11::isinstance<pybind11::bool_>(v)) {
        return std::string(v.cast<bool>() ? "true" : "false");
    }
    if (pybind11::isinstance<pybind11::int_>(v)) {
        return v.cast<int64_t>();
    }
    if (pybind11::isinstance<pybind11::float_>(v)) {
        return v.cast<double>();
    }
    return std::string(pybind11::str(v));
}

// The option table's pairs set on the default compression, as the CLI's flags and the server's kv_compression are,
// then validated (throws option_error: a ValueError).
inline compression compression_of(const pybind11::kwargs & options) {
    compression c;
    for (const auto & [key, value] : options) {
        set_option(c, std::string(pybind11::str(key)), option_value_of(value));
    }
    c.validate();
    return c;
}

}  // namespace ecokv::python
