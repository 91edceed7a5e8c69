// castmesh's declaration of the DLPack ABI (the in-memory tensor exchange
// format used by NumPy, PyTorch, CuPy, JAX, ...), written from the DLPack
// specification, version 1.0 (https://dmlc.github.io/dlpack/latest/).
//
// Struct layouts and constant values are facts of the ABI and must match the
// specification exactly: castmesh hands these structs to other libraries and
// receives theirs. Names follow the specification's so that readers can match
// them, but live in namespace castmesh so that this header coexists with any
// other dlpack.h in the same program; the specification's flag macros are
// constexpr constants here for the same reason. Plain data; any thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace castmesh {

// The DLPack version this header declares. A producer stamps it into
// DLManagedTensorVersioned::version; a consumer accepts any minor of its
// major (minor versions only append).
inline constexpr uint32_t kDLPackMajorVersion = 1;
inline constexpr uint32_t kDLPackMinorVersion = 0;

// A (major, minor) DLPack ABI version.
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

// Where a tensor's memory lives. Values are fixed by the specification;
// codes 5 and 6 are unused (retired).
enum DLDeviceType : int32_t {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,  // page-locked host memory allocated through CUDA
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,  // page-locked host memory allocated through ROCm
  kDLExtDev = 12,
  kDLCUDAManaged = 13,  // CUDA unified memory
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
};

// A device: its type and its index among devices of that type.
struct DLDevice {
  DLDeviceType device_type;
  int32_t device_id;
};

// The kind of number an element is (DLDataType::code).
enum DLDataTypeCode : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
};

// An element type: code (a DLDataTypeCode), bits per lane, lanes per element.
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

// A tensor's description, not its ownership. shape and strides hold ndim
// entries; strides are in elements, and a null strides means compact
// row-major. The first element is at (char*)data + byte_offset.
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};

// The pre-1.0 ("legacy", capsule name "dltensor") managed tensor. The
// consumer calls deleter(self) once when done; deleter may be null.
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

// DLManagedTensorVersioned::flags bits (DLPACK_FLAG_BITMASK_READ_ONLY and
// DLPACK_FLAG_BITMASK_IS_COPIED in the specification).
// The consumer must not write through the tensor.
inline constexpr uint64_t kDLPackFlagBitmaskReadOnly = uint64_t{1} << 0;
// The producer copied the data for this export (nothing else aliases it).
inline constexpr uint64_t kDLPackFlagBitmaskIsCopied = uint64_t{1} << 1;

// The 1.0 managed tensor (capsule name "dltensor_versioned"). version,
// manager_ctx and deleter come first so that a consumer of any major version
// can read the version and release a tensor it cannot use.
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

// The ABI, checked where castmesh is built (LP64: 8-byte pointers).
static_assert(sizeof(DLPackVersion) == 8);
static_assert(sizeof(DLDeviceType) == 4);
static_assert(sizeof(DLDevice) == 8 && offsetof(DLDevice, device_id) == 4);
static_assert(sizeof(DLDataType) == 4 && offsetof(DLDataType, bits) == 1 && offsetof(DLDataType, lanes) == 2);
static_assert(sizeof(void*) == 8, "castmesh's DLPack declarations assume 64-bit pointers");
static_assert(offsetof(DLTensor, data) == 0 && offsetof(DLTensor, device) == 8 && offsetof(DLTensor, ndim) == 16 &&
              offsetof(DLTensor, dtype) == 20 && offsetof(DLTensor, shape) == 24 &&
              offsetof(DLTensor, strides) == 32 && offsetof(DLTensor, byte_offset) == 40 && sizeof(DLTensor) == 48);
static_assert(offsetof(DLManagedTensor, manager_ctx) == 48 && offsetof(DLManagedTensor, deleter) == 56 &&
              sizeof(DLManagedTensor) == 64);
static_assert(offsetof(DLManagedTensorVersioned, manager_ctx) == 8 &&
              offsetof(DLManagedTensorVersioned, deleter) == 16 && offsetof(DLManagedTensorVersioned, flags) == 24 &&
              offsetof(DLManagedTensorVersioned, dl_tensor) == 32 && sizeof(DLManagedTensorVersioned) == 80);

}  // namespace castmesh
