// Client.save's arguments as ftrun tensors (save_refs.h).
#include "plugin/python/save_refs.h"

#include <string>
#include <utility>
#include <vector>

#include "plugin/python/buffers.h"

namespace ftrun::python {
namespace {

void CheckNamesKnown(const py::object& mapping, const py::dict& tensors, const char* what) {
  if (mapping.is_none()) return;
  if (!PyDict_Check(mapping.ptr())) {
    throw py::type_error(std::string(what) + " must be a dict of tensor name -> value or None, not " +
                         std::string(py::str(py::type::handle_of(mapping).attr("__name__"))));
  }
  for (auto item : py::reinterpret_borrow<py::dict>(mapping)) {
    if (!tensors.contains(item.first)) {
      throw py::value_error(std::string(what) + " names '" + std::string(py::str(item.first)) +
                            "', which is not in tensors");
    }
  }
}

py::object Lookup(const py::object& mapping, py::handle key) {
  if (mapping.is_none()) return py::none();
  PyObject* value = PyDict_GetItemWithError(mapping.ptr(), key.ptr());  // borrowed
  if (value == nullptr && PyErr_Occurred()) throw py::error_already_set();
  return value == nullptr ? py::none() : py::reinterpret_borrow<py::object>(value);
}

}  // namespace

std::vector<TensorRef> ToTensorRefs(const py::dict& tensors, const py::object& generations, const py::object& dtypes,
                                    std::vector<py::buffer_info>* buffers, const py::object& same, LastRefs* last) {
  if (!same.is_none() && !PyAnySet_Check(same.ptr())) {
    throw py::type_error("same_buffers must be a set of tensor names or None, not " +
                         std::string(py::str(py::type::handle_of(same).attr("__name__"))));
  }
  if (same.is_none()) {
    if (last != nullptr) last->by_name.clear();
    last = nullptr;
  }
  CheckNamesKnown(generations, tensors, "generations");
  CheckNamesKnown(dtypes, tensors, "dtypes");
  buffers->clear();
  buffers->resize(tensors.size());
  std::vector<TensorRef> refs;
  refs.reserve(tensors.size());
  LastRefs next;
  for (auto item : tensors) {
    if (!py::isinstance<py::str>(item.first)) throw py::type_error("tensor names must be str");
    const std::string name = py::str(item.first);
    const size_t i = refs.size();
    py::object dtype = Lookup(dtypes, item.first);
    int keep = 0;
    if (last != nullptr && (keep = PySet_Contains(same.ptr(), item.first.ptr())) < 0) throw py::error_already_set();
    auto known = keep ? last->by_name.find(name) : decltype(last->by_name)::iterator{};
    if (keep && known != last->by_name.end() && known->second.value.is(item.second) && known->second.dtype.is(dtype)) {
      refs.push_back(known->second.ref);
    } else {
      refs.push_back(ToTensorRef(name, item.second, dtype, &(*buffers)[i]));
    }
    if (keep) {
      next.by_name.emplace(name, LastRefs::Entry{py::reinterpret_borrow<py::object>(item.second), dtype, refs.back()});
    }
    py::object gen = Lookup(generations, item.first);
    if (gen.is_none()) continue;
    try {
      refs.back().generation = gen.cast<uint64_t>();
    } catch (const py::cast_error&) {
      throw py::value_error("generations['" + name + "'] must be a non-negative int");
    }
  }
  if (last != nullptr) *last = std::move(next);
  return refs;
}

}  // namespace ftrun::python
