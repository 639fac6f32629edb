#include "plugin/python/buffers.h"

#include <cstdint>
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

ftrun::TensorRef ToTensorRef(const std::string& name, py::handle value, const py::object& dtype_override,
                             py::buffer_info* info) {
  const std::string where = "tensor '" + name + "'";
  if (!PyObject_CheckBuffer(value.ptr())) {
    throw py::type_error(where + ": a " + std::string(py::str(value.get_type().attr("__name__"))) +
                         " does not support the buffer protocol (pass a numpy array, "
                         "bytearray or memoryview; for a torch tensor, .numpy())");
  }
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
  // An override reinterprets the bytes, like numpy's .view(dtype).
  const std::string dtype_name = py::str(dtype_override);
  if (!ftrun::ParseDType(dtype_name, &ref.dtype)) {
    throw py::value_error(where + ": unknown dtype '" + dtype_name + "'");
  }
  const auto size = static_cast<int64_t>(ftrun::DTypeSize(ref.dtype));
  if (info->itemsize == size) return ref;
  if (info->itemsize != 1 || ref.shape.empty() || ref.shape.back() % size != 0) {
    throw py::value_error(where + ": cannot view a buffer of item size " + std::to_string(info->itemsize) + " as " +
                          dtype_name + " (pass an item size of " + std::to_string(size) +
                          ", or uint8 with a last dimension that is a multiple of " + std::to_string(size) + ")");
  }
  ref.shape.back() /= size;
  return ref;
}

}  // namespace ftrun::python
