// Status -> Python exception, once for the whole _ftrun module: every
// failed call raises _ftrun.Error (a RuntimeError), or for
// INVALID_ARGUMENT _ftrun.InvalidArgumentError (also a ValueError), with
// .code (the status code's name) and .message (its text).
#pragma once

#include <pybind11/pybind11.h>

#include "ftrun/status.h"

namespace ftrun::python {

// Creates the two exception types and adds them to `m` (at import, once;
// they live as long as the process).
void RegisterErrors(pybind11::module_& m);

// Raises the exception for a failed `st` (throws pybind11::error_already_set).
[[noreturn]] void Raise(const Status& st);

}  // namespace ftrun::python
