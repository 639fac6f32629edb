#include <string_view>

#include "ftrun/client.h"

namespace ftrun {
namespace {

struct DTypeEntry {
  DType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {DType::kUInt8, "uint8", 1},       {DType::kInt8, "int8", 1},       {DType::kInt16, "int16", 2},
    {DType::kInt32, "int32", 4},       {DType::kInt64, "int64", 8},     {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2}, {DType::kFloat32, "float32", 4}, {DType::kFloat64, "float64", 8},
    {DType::kBool, "bool", 1},         {DType::kUInt16, "uint16", 2},   {DType::kUInt32, "uint32", 4},
    {DType::kUInt64, "uint64", 8},
};

}  // namespace

size_t DTypeSize(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e.size;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "unknown";
}

bool ParseDType(std::string_view name, DType* out) {
  for (const auto& e : kDTypes) {
    if (name == e.name) {
      *out = e.dtype;
      return true;
    }
  }
  return false;
}

}  // namespace ftrun
