// Conversions between Python buffers (PEP 3118: numpy arrays, bytearray,
// memoryview) and ftrun tensors, for the _ftrun module. Called with the GIL
// held; they raise Python exceptions (TypeError, ValueError) on bad input.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "ftrun/client.h"

namespace ftrun::python {

namespace py = pybind11;

// Maps a PEP 3118 format to a DType; "" on success, else why not.
std::string FormatToDType(std::string format, py::ssize_t itemsize, DType* out);
// C order in numpy's sense: dimensions of extent 1 may have any stride.
bool IsCContiguous(const py::buffer_info& info);
// The numpy dtype name a loaded tensor comes back as (bfloat16 as uint16).
const char* NumpyDTypeName(DType d);
// Builds the TensorRef for one dict entry, keeping its buffer in *info.
// dtype_override (None or a dtype name) reinterprets the bytes.
TensorRef ToTensorRef(const std::string& name, py::handle value, const py::object& dtype_override,
                      py::buffer_info* info);

}  // namespace ftrun::python
