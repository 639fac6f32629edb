// Client.save's arguments as ftrun tensors, for the _ftrun module: a
// TensorRef per entry of the tensors dict (buffers.h's conversions), and the
// last save's refs that a save passing the same objects again reuses.
// Called with the GIL held; raises TypeError or ValueError on bad input.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "ftrun/client.h"

namespace ftrun::python {

namespace py = pybind11;

// The TensorRefs of the last save's entries that Client.save(same_buffers=)
// named, by name, with the objects they were read from, kept alive here:
// an entry is used again when the same object comes back under the same
// name with the same dtype override, without reading its buffer again.
struct LastRefs {
  struct Entry {
    py::object value;
    py::object dtype;
    TensorRef ref;
  };
  std::unordered_map<std::string, Entry> by_name;
};
// Client.save's arguments: a TensorRef per entry of tensors (name ->
// buffer or CUDA memory), with generations and dtypes (None or dicts
// naming only those entries) applied; *buffers keeps the buffers held.
// same: None (*last is emptied), or a set of names whose objects the caller
// keeps unchanged; *last holds those of the last save and is replaced by
// this one's.
std::vector<TensorRef> ToTensorRefs(const py::dict& tensors, const py::object& generations, const py::object& dtypes,
                                    std::vector<py::buffer_info>* buffers, const py::object& same = py::none(),
                                    LastRefs* last = nullptr);

}  // namespace ftrun::python
