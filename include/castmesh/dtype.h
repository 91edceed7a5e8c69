// DType: the element types of the data plane (TensorView, Communicator,
// RdmaBuffer). Values and names follow DLPack's (code, bits) pairs so that a
// DType converts to and from a DLDataType without a table. Pure values; any
// thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace castmesh {

// An element type of a tensor. Only scalar, single-lane types.
enum class DType : uint8_t {
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kUInt16,
  kUInt32,
  kUInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kBool,
};

// Every DType, in declaration order (for tests and tables).
inline constexpr DType kAllDTypes[] = {
    DType::kInt8,    DType::kInt16,    DType::kInt32,   DType::kInt64,   DType::kUInt8,
    DType::kUInt16,  DType::kUInt32,   DType::kUInt64,  DType::kFloat16, DType::kBFloat16,
    DType::kFloat32, DType::kFloat64,  DType::kBool,
};

// Bytes per element.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
      return 1;
    case DType::kInt16:
    case DType::kUInt16:
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
    case DType::kUInt32:
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
    case DType::kUInt64:
    case DType::kFloat64:
      return 8;
  }
  return 0;
}

// NumPy-style name: "int8" ... "float64", "bfloat16", "bool".
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kUInt16: return "uint16";
    case DType::kUInt32: return "uint32";
    case DType::kUInt64: return "uint64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kBool: return "bool";
  }
  return "?";
}

// The DType named `name` (as dtype_name prints it), if any.
constexpr std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : kAllDTypes) {
    if (dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

constexpr bool dtype_is_float(DType t) {
  return t == DType::kFloat16 || t == DType::kBFloat16 || t == DType::kFloat32 || t == DType::kFloat64;
}
constexpr bool dtype_is_signed_int(DType t) {
  return t == DType::kInt8 || t == DType::kInt16 || t == DType::kInt32 || t == DType::kInt64;
}
constexpr bool dtype_is_unsigned_int(DType t) {
  return t == DType::kUInt8 || t == DType::kUInt16 || t == DType::kUInt32 || t == DType::kUInt64;
}

}  // namespace castmesh
