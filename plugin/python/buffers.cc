#include "plugin/python/buffers.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

namespace ftrun::python {

std::string FormatToDType(std::string format, py::ssize_t itemsize, DType* out) {
  constexpr bool kLittle = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
  if (!format.empty() && std::string("@=<>!").find(format[0]) != std::string::npos) {
    const bool little = format[0] == '<';
    const bool big = format[0] == '>' || format[0] == '!';
    if ((little && !kLittle) || (big && kLittle)) return "non-native byte order";
    format.erase(0, 1);
  }
  if (format.size() != 1) return "unsupported buffer format '" + format + "'";
  const char c = format[0];
  auto by_size = [&](DType s1, DType s2, DType s4, DType s8) -> std::string {
    switch (itemsize) {
      case 1:
        *out = s1;
        return "";
      case 2:
        *out = s2;
        return "";
      case 4:
        *out = s4;
        return "";
      case 8:
        *out = s8;
        return "";
    }
    return "unsupported item size " + std::to_string(itemsize);
  };
  auto exact = [&](DType d, py::ssize_t size) -> std::string {
    if (itemsize != size) return "unexpected item size " + std::to_string(itemsize);
    *out = d;
    return "";
  };
  switch (c) {
    case 'e':
      return exact(DType::kFloat16, 2);
    case 'f':
      return exact(DType::kFloat32, 4);
    case 'd':
      return exact(DType::kFloat64, 8);
    case '?':
      return exact(DType::kBool, 1);
    case 'c':
      return exact(DType::kUInt8, 1);
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
    case 'n':
      return by_size(DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64);
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q':
    case 'N':
      return by_size(DType::kUInt8, DType::kUInt16, DType::kUInt32, DType::kUInt64);
  }
  return "unsupported buffer format '" + format + "'";
}

bool IsCContiguous(const py::buffer_info& info) {
  for (py::ssize_t extent : info.shape) {
    if (extent == 0) return true;
  }
  py::ssize_t expected = info.itemsize;
  for (size_t d = info.shape.size(); d-- > 0;) {
    if (info.shape[d] != 1 && info.strides[d] != expected) return false;
    expected *= info.shape[d];
  }
  return true;
}

const char* NumpyDTypeName(DType d) {
  switch (d) {
    case DType::kBFloat16:
      return "uint16";  // numpy has no bfloat16
    case DType::kBool:
      return "bool";
    default:
      return ftrun::DTypeName(d);
  }
}

py::array NewArray(DType d, const std::vector<py::ssize_t>& shape, void* data, py::handle base) {
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = static_cast<py::ssize_t>(ftrun::DTypeSize(d));
  for (size_t k = shape.size(); k-- > 0;) {
    strides[k] = stride;
    stride *= std::max<py::ssize_t>(shape[k], 1);
  }
  if (data == nullptr) return py::array(py::dtype(NumpyDTypeName(d)), shape, strides);
  return py::array(py::dtype(NumpyDTypeName(d)), shape, strides, data, base);
}

namespace {

// An override reinterprets the bytes, like numpy's .view(dtype): the same
// item size, or bytes (item size 1) whose last dimension it divides.
void ApplyOverride(const std::string& where, py::ssize_t itemsize, const py::object& dtype_override,
                   ftrun::TensorRef* ref) {
  const std::string dtype_name = py::str(dtype_override);
  if (!ftrun::ParseDType(dtype_name, &ref->dtype)) {
    throw py::value_error(where + ": unknown dtype '" + dtype_name + "'");
  }
  const auto size = static_cast<int64_t>(ftrun::DTypeSize(ref->dtype));
  if (itemsize == size) return;
  if (itemsize != 1 || ref->shape.empty() || ref->shape.back() % size != 0) {
    throw py::value_error(where + ": cannot view a buffer of item size " + std::to_string(itemsize) + " as " +
                          dtype_name + " (pass an item size of " + std::to_string(size) +
                          ", or uint8 with a last dimension that is a multiple of " + std::to_string(size) + ")");
  }
  ref->shape.back() /= size;
}

// A __cuda_array_interface__ typestr ("<f4", "|u1", "|b1") as a PEP 3118
// format and item size.
std::string TypestrToFormat(const std::string& typestr, std::string* format, py::ssize_t* itemsize) {
  if (typestr.size() < 3) return "malformed typestr '" + typestr + "'";
  const char order = typestr[0], kind = typestr[1];
  try {
    *itemsize = std::stoi(typestr.substr(2));
  } catch (const std::exception&) {
    return "malformed typestr '" + typestr + "'";
  }
  const std::string prefix = order == '>' ? ">" : "<";  // '|' and '<' are native here
  switch (kind) {
    case 'f':
      *format = prefix + (*itemsize == 2 ? "e" : *itemsize == 4 ? "f" : "d");
      return *itemsize == 2 || *itemsize == 4 || *itemsize == 8 ? "" : "unsupported typestr '" + typestr + "'";
    case 'i':
      *format = prefix + "q";
      return "";
    case 'u':
      *format = prefix + "Q";
      return "";
    case 'b':
      *format = prefix + "?";
      return "";
  }
  return "unsupported typestr '" + typestr + "' (pass uint8 bytes with a dtype override)";
}

}  // namespace

ftrun::TensorRef ToTensorRef(const std::string& name, py::handle value, const py::object& dtype_override,
                             py::buffer_info* info) {
  // Host memory first: a save hands over one numpy array per tensor, and
  // asking each for a __cuda_array_interface__ it lacks costs an exception.
  // Objects without a buffer go to the CUDA path, which reads the interface
  // once (torch computes it in Python on every read); one whose property
  // raises still goes there, to report why.
  if (!PyObject_CheckBuffer(value.ptr())) {
    if (PyObject* desc = PyObject_GetAttrString(value.ptr(), "__cuda_array_interface__")) {
      return CudaTensorRefOf(name, py::reinterpret_steal<py::object>(desc), dtype_override);
    }
    PyErr_Clear();
    if (py::hasattr(py::type::handle_of(value), "__cuda_array_interface__")) {
      return ToCudaTensorRef(name, value, dtype_override);
    }
    throw py::type_error("tensor '" + name + "': a " +
                         std::string(py::str(py::type::handle_of(value).attr("__name__"))) +
                         " does not support the buffer protocol (pass a numpy array, "
                         "bytearray or memoryview; for a torch tensor, .numpy(); for CUDA memory, an "
                         "object with __cuda_array_interface__)");
  }
  const std::string where = "tensor '" + name + "'";
  *info = py::reinterpret_borrow<py::buffer>(value).request();
  if (!IsCContiguous(*info)) {
    throw py::value_error(where + " is not C-contiguous (use numpy.ascontiguousarray)");
  }
  ftrun::TensorRef ref;
  ref.name = name;
  ref.data = info->ptr;
  ref.nbytes = static_cast<uint64_t>(info->size) * static_cast<uint64_t>(info->itemsize);
  ref.shape.assign(info->shape.begin(), info->shape.end());
  const std::string why = FormatToDType(info->format, info->itemsize, &ref.dtype);
  if (dtype_override.is_none()) {
    if (!why.empty()) throw py::type_error(where + ": " + why);
    return ref;
  }
  ApplyOverride(where, info->itemsize, dtype_override, &ref);
  return ref;
}

ftrun::TensorRef ToCudaTensorRef(const std::string& name, py::handle value, const py::object& dtype_override) {
  py::object desc;
  try {
    desc = value.attr("__cuda_array_interface__");
  } catch (const py::error_already_set& e) {
    throw py::type_error("tensor '" + name + "' (__cuda_array_interface__): cannot read it: " + std::string(e.what()) +
                         " (for a CPU torch tensor, pass .numpy())");
  }
  return CudaTensorRefOf(name, desc, dtype_override);
}

ftrun::TensorRef CudaTensorRefOf(const std::string& name, const py::object& desc, const py::object& dtype_override) {
  const std::string where = "tensor '" + name + "' (__cuda_array_interface__)";
  if (!py::isinstance<py::dict>(desc)) throw py::type_error(where + " is not a dict");
  py::dict cai = py::reinterpret_borrow<py::dict>(desc);
  for (const char* key : {"shape", "typestr", "data"}) {
    if (!cai.contains(key)) throw py::value_error(where + " lacks the field '" + key + "'");
  }
  // A tuple field, or a ValueError naming it.
  auto tuple_field = [&](const char* key) {
    py::object v = cai[key];
    if (!py::isinstance<py::tuple>(v)) throw py::value_error(where + ": field '" + key + "' must be a tuple");
    return py::reinterpret_borrow<py::tuple>(v);
  };
  auto int_of = [&](py::handle v, const char* key) {
    try {
      return v.cast<int64_t>();
    } catch (const py::cast_error&) {
      throw py::value_error(where + ": field '" + key + "' must hold ints");
    }
  };
  ftrun::TensorRef ref;
  ref.name = name;
  ref.device = ftrun::Device::kCuda;
  py::tuple data = tuple_field("data");
  if (data.size() != 2) throw py::value_error(where + ": field 'data' must be (pointer, read_only)");
  ref.data = reinterpret_cast<const void*>(static_cast<uintptr_t>(int_of(data[0], "data")));
  py::ssize_t count = 1;
  for (auto extent : tuple_field("shape")) {
    const int64_t e = int_of(extent, "shape");
    if (e < 0) throw py::value_error(where + ": field 'shape' has a negative extent");
    ref.shape.push_back(e);
    count *= static_cast<py::ssize_t>(e);
  }
  std::string format;
  py::ssize_t itemsize = 0;
  std::string why = TypestrToFormat(py::str(cai["typestr"]), &format, &itemsize);
  if (why.empty()) why = FormatToDType(format, itemsize, &ref.dtype);
  if (!why.empty() && dtype_override.is_none()) throw py::type_error(where + ": " + why);
  if (!why.empty()) itemsize = std::max<py::ssize_t>(itemsize, 1);
  // C-contiguous: no strides, or the ones C order gives (extent-1 dims free).
  if (cai.contains("strides") && !cai["strides"].is_none()) {
    py::tuple strides = tuple_field("strides");
    py::ssize_t expected = itemsize;
    bool empty = count == 0, ok = strides.size() == ref.shape.size();
    for (size_t d = ref.shape.size(); ok && d-- > 0;) {
      if (ref.shape[d] != 1 && int_of(strides[d], "strides") != expected) ok = false;
      expected *= static_cast<py::ssize_t>(ref.shape[d]);
    }
    if (!ok && !empty) throw py::value_error(where + " is not C-contiguous (use .contiguous())");
  }
  ref.nbytes = static_cast<uint64_t>(count) * static_cast<uint64_t>(itemsize);
  if (!dtype_override.is_none()) ApplyOverride(where, itemsize, dtype_override, &ref);
  return ref;
}

namespace {

// Client.load's cuda= and into=: per loaded tensor, what `convert` makes of
// the entry naming it (an empty TensorRef where none does). Every name must
// be a loaded tensor, every entry exactly the saved size.
template <typename Convert>
std::vector<TensorRef> LoadTargets(const std::vector<TensorInfo>& infos, const py::object& targets_arg,
                                   const std::string& arg, Convert convert) {
  std::vector<TensorRef> out(infos.size());
  if (targets_arg.is_none()) return out;
  if (!py::isinstance<py::dict>(targets_arg))
    throw py::type_error(arg + " must be a dict (or a callable returning one)");
  py::dict targets = py::reinterpret_borrow<py::dict>(targets_arg);
  for (size_t i = 0; i < infos.size(); ++i) {
    if (!targets.contains(infos[i].name)) continue;
    const std::string where = arg + "['" + infos[i].name + "']";
    out[i] = convert(where, infos[i].name, targets[infos[i].name.c_str()]);
    if (out[i].nbytes != infos[i].nbytes) {
      throw py::value_error(where + " is " + std::to_string(out[i].nbytes) + " bytes, the saved tensor " +
                            std::to_string(infos[i].nbytes));
    }
  }
  for (auto item : targets) {
    const std::string name = py::str(item.first);
    bool found = false;
    for (const auto& t : infos) found |= t.name == name;
    if (!found) throw py::value_error(arg + " names '" + name + "', which is not in the loaded version");
  }
  return out;
}

}  // namespace

py::object ResolveTargets(const py::object& arg, const std::string& user_bytes) {
  return !arg.is_none() && PyCallable_Check(arg.ptr()) != 0 ? arg(py::bytes(user_bytes)) : arg;
}

std::vector<TensorRef> CudaTargets(const std::vector<TensorInfo>& infos, const py::object& targets) {
  return LoadTargets(infos, targets, "cuda", [](const std::string&, const std::string& name, py::handle value) {
    return ToCudaTensorRef(name, value, py::none());
  });
}

std::vector<TensorRef> HostTargets(const std::vector<TensorInfo>& infos, const py::object& targets,
                                   std::vector<py::buffer_info>* views) {
  views->clear();
  return LoadTargets(infos, targets, "into", [&](const std::string& where, const std::string& name, py::handle value) {
    if (!PyObject_CheckBuffer(value.ptr())) {
      throw py::type_error(where + ": a " + std::string(py::str(py::type::handle_of(value).attr("__name__"))) +
                           " does not support the buffer protocol (for a torch tensor: "
                           "t.view(-1).view(torch.uint8).numpy())");
    }
    py::buffer_info info;
    try {
      info = py::reinterpret_borrow<py::buffer>(value).request(/*writable=*/true);
    } catch (py::error_already_set&) {
      throw py::value_error(where + " is read-only: expected writable memory");
    }
    if (!IsCContiguous(info)) throw py::value_error(where + " is not C-contiguous");
    TensorRef ref;
    ref.name = name;
    ref.data = info.ptr;
    ref.nbytes = static_cast<uint64_t>(info.size) * static_cast<uint64_t>(info.itemsize);
    views->push_back(std::move(info));  // (ref.data points into the buffer, not into info)
    return ref;
  });
}

py::dict StatsToDict(const ftrun::SaveStats& s) {
  py::dict d;
  d["bytes_total"] = s.bytes_total;
  d["bytes_hashed"] = s.bytes_hashed;
  d["bytes_copied"] = s.bytes_copied;
  d["chunks_total"] = s.chunks_total;
  d["chunks_copied"] = s.chunks_copied;
  d["chunks_skipped"] = s.chunks_skipped;
  d["chunks_unchanged"] = s.chunks_unchanged;
  d["stall_seconds"] = s.stall_seconds;
  return d;
}

py::list ToList(const std::vector<uint64_t>& values) {
  py::list out;
  for (uint64_t v : values) out.append(v);
  return out;
}

}  // namespace ftrun::python
