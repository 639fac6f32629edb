// Conversions between Python buffers (PEP 3118: numpy arrays, bytearray,
// memoryview) and ftrun tensors, for the _ftrun module. Called with the GIL
// held; they raise Python exceptions (TypeError, ValueError) on bad input.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "ftrun/client.h"

namespace ftrun::python {

namespace py = pybind11;

// Maps a PEP 3118 format to a DType; "" on success, else why not.
std::string FormatToDType(std::string format, py::ssize_t itemsize, DType* out);
// C order in numpy's sense: dimensions of extent 1 may have any stride.
bool IsCContiguous(const py::buffer_info& info);
// The numpy dtype name a loaded tensor comes back as (bfloat16 as uint16).
const char* NumpyDTypeName(DType d);
// A C-ordered numpy array of d's numpy dtype: new memory, or a view of data
// kept alive by base. Strides are given explicitly: pybind11 before 2.12
// reads a dtype's item size at numpy 1's offset, wrong under numpy 2.
py::array NewArray(DType d, const std::vector<py::ssize_t>& shape, void* data = nullptr,
                   py::handle base = py::handle());
// Builds the TensorRef for one dict entry, keeping its buffer in *info.
// dtype_override (None or a dtype name) reinterprets the bytes. An object
// with __cuda_array_interface__ goes to ToCudaTensorRef.
TensorRef ToTensorRef(const std::string& name, py::handle value, const py::object& dtype_override,
                      py::buffer_info* info);
// The TensorRef (device kCuda) of C-contiguous CUDA memory described by
// value's __cuda_array_interface__ (torch CUDA tensors, CuPy, Numba); its
// "stream" field is not used: Client.save(cuda_stream=) orders the copies.
TensorRef ToCudaTensorRef(const std::string& name, py::handle value, const py::object& dtype_override);
// The same from an interface dict already read (desc).
TensorRef CudaTensorRefOf(const std::string& name, const py::object& desc, const py::object& dtype_override);
// Client.load's cuda= and into=: None, a dict, or a callable given the
// version's user bytes that returns one (called here).
py::object ResolveTargets(const py::object& arg, const std::string& user_bytes);
// Client.load(cuda=...): per loaded tensor, the CUDA memory it goes to
// (device kCuda), or an empty TensorRef (device kHost) when targets (None
// or a dict name -> CUDA memory of the saved size) does not name it.
// Raises ValueError for a wrong size or a name not in infos.
std::vector<TensorRef> CudaTargets(const std::vector<TensorInfo>& infos, const py::object& targets);
// Client.load(into=...): the same for host memory (a writable C-contiguous
// buffer of the saved size: data set), the buffers' views kept in *views.
std::vector<TensorRef> HostTargets(const std::vector<TensorInfo>& infos, const py::object& targets,
                                   std::vector<py::buffer_info>* views);

// Client.save's statistics as a dict; a list of ints.
py::dict StatsToDict(const SaveStats& s);
py::list ToList(const std::vector<uint64_t>& values);

}  // namespace ftrun::python
