// ecokv.Model and ecokv.Sequence (python/session.cpp), added to the module by module.cpp.
#pragma once

#include <pybind11/pybind11.h>

void add_session(pybind11::module_ & m);
