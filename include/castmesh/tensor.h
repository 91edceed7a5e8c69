// TensorView: the data plane's description of a numeric buffer (pointer,
// dtype, shape, strides, byte offset, device, read-only flag) plus an owner
// that keeps the memory alive, and its DLPack import/export. The Communicator
// and RdmaBuffer take TensorViews; Python objects become TensorViews through
// DLPack or the buffer protocol (python/src/tensor_binding.h). docs/tensors.md.
//
// A TensorView is an immutable value: copying one copies the description and
// shares the owner. Any thread may use distinct or shared TensorViews
// concurrently; writing the memory they describe is the caller's business.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "castmesh/dlpack.h"
#include "castmesh/dtype.h"

namespace castmesh {

// Where a tensor's memory lives; values are DLPack's DLDeviceType codes so a
// Device converts to a DLDevice without a table.
enum class DeviceKind : int32_t {
  kCpu = kDLCPU,
  kCuda = kDLCUDA,
  kCudaHost = kDLCUDAHost,
  kOpenCl = kDLOpenCL,
  kVulkan = kDLVulkan,
  kMetal = kDLMetal,
  kVpi = kDLVPI,
  kRocm = kDLROCM,
  kRocmHost = kDLROCMHost,
  kExtDev = kDLExtDev,
  kCudaManaged = kDLCUDAManaged,
  kOneApi = kDLOneAPI,
  kWebGpu = kDLWebGPU,
  kHexagon = kDLHexagon,
};

// The DeviceKind whose DLPack code is `code`, if castmesh knows it.
std::optional<DeviceKind> device_kind_from_dlpack(int32_t code);
// Lower-case name: "cpu", "cuda", "cuda_host", "rocm", ...
const char* device_kind_name(DeviceKind kind);

// A device: kind and index among devices of that kind.
struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int32_t index = 0;

  // True for plain host memory (DeviceKind::kCpu).
  bool is_cpu() const { return kind == DeviceKind::kCpu; }
  // True when the CPU may read and write the memory directly: host memory,
  // pinned host memory of CUDA/ROCm, and CUDA managed memory.
  bool is_host_accessible() const;
  // "cpu", "cuda:1", ...
  std::string to_string() const;

  friend bool operator==(const Device&, const Device&) = default;
};

// DLPack's (code, bits, lanes=1) for a DType.
DLDataType dtype_to_dlpack(DType dtype);
// The DType of a DLPack data type, if castmesh supports it (single lane,
// integers, floats of 16/32/64 bits, bfloat16, bool of 8 bits).
std::optional<DType> dtype_from_dlpack(DLDataType dtype);

// A strided view of typed memory; see the file comment.
class TensorView {
 public:
  // Sizes or strides, one entry per dimension. Views of up to kInlineDims
  // dimensions keep them in place, so making or copying one allocates
  // nothing (a copy per call was most of a small collective's allocations).
  static constexpr size_t kInlineDims = 4;
  using Dims = absl::InlinedVector<int64_t, kInlineDims>;

  // An empty view: no data, shape {0}, float32, CPU.
  TensorView();

  // A validated view. `strides` are in elements (may be negative or zero);
  // empty means C-contiguous. `data` is the base pointer; the first element
  // is at data + byte_offset. `owner` is kept alive as long as any copy of the
  // view (or a DLPack export of it) lives. InvalidArgument on a negative
  // size, a strides/shape length mismatch, a negative byte offset, null data
  // with elements, or sizes/extents that overflow 64-bit byte offsets.
  static absl::StatusOr<TensorView> Create(void* data, DType dtype, absl::Span<const int64_t> shape,
                                           absl::Span<const int64_t> strides, Device device = {},
                                           std::shared_ptr<void> owner = nullptr, bool read_only = false,
                                           int64_t byte_offset = 0);
  // A C-contiguous CPU view. The shape must be valid (sizes >= 0, no
  // overflow, data non-null unless empty): a bad one is a programming error
  // and aborts with the reason; take Create's Status for untrusted shapes.
  static TensorView Contiguous(void* data, DType dtype, absl::Span<const int64_t> shape,
                               std::shared_ptr<void> owner = nullptr, bool read_only = false);
  // Zeroed, 64-byte aligned CPU memory owned by the view. Aborts on an
  // invalid shape or when memory runs out; TryAllocate returns those as a Status.
  static TensorView Allocate(DType dtype, absl::Span<const int64_t> shape);
  // Allocate that returns InvalidArgument (bad shape) or ResourceExhausted.
  static absl::StatusOr<TensorView> TryAllocate(DType dtype, absl::Span<const int64_t> shape);

  // The first element's address (base pointer + byte offset); null when empty.
  void* data() const;
  // The element type.
  DType dtype() const { return dtype_; }
  // Sizes, outermost first; empty for a 0-d (single element) view. Valid
  // as long as this view (not a copy of it) lives.
  absl::Span<const int64_t> shape() const { return shape_; }
  // Strides in elements, one per dimension (filled in for contiguous views).
  absl::Span<const int64_t> strides() const { return strides_; }
  // Bytes from the base pointer (DLTensor::data) to the first element.
  int64_t byte_offset() const { return byte_offset_; }
  // Where the memory lives.
  Device device() const { return device_; }
  // True when nobody may write through this view (DLPack's read-only flag).
  bool read_only() const { return read_only_; }
  // What keeps the memory alive (may be null for borrowed memory).
  const std::shared_ptr<void>& owner() const { return owner_; }

  // Number of dimensions.
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  // Number of elements (1 for a 0-d view, 0 if any size is 0).
  int64_t numel() const { return numel_; }
  // Bytes per element.
  size_t itemsize() const { return dtype_size(dtype_); }
  // numel() * itemsize(): the bytes of the elements, not of the strided span.
  size_t nbytes() const { return static_cast<size_t>(numel_) * itemsize(); }
  // True when the elements are dense in C (row-major) order; strides of
  // dimensions of size 1 do not matter, and every empty view is contiguous.
  bool is_contiguous() const;

  // A C-contiguous copy in fresh castmesh-owned CPU memory (writable).
  // FailedPrecondition unless the device is host-accessible.
  absl::StatusOr<TensorView> ContiguousCopy() const;

  // This view with `owner` in place of its owner (e.g. one that also holds a
  // Python reference); the new owner must keep the memory alive itself.
  TensorView with_owner(std::shared_ptr<void> owner) const;

  // DLPack export. The result keeps this view's owner alive until the
  // consumer calls its deleter, which frees it; exactly one call is expected.
  // A read-only view sets kDLPackFlagBitmaskReadOnly; the legacy form cannot
  // say "read-only" (Python's __dlpack__ refuses such an export instead).
  DLManagedTensorVersioned* to_dlpack_versioned() const;
  DLManagedTensor* to_dlpack_legacy() const;

  // DLPack import. Takes ownership of `managed` whatever the outcome: the
  // deleter runs when the last copy of the returned view dies, or before
  // returning an error. InvalidArgument for a null tensor, a major version
  // other than 1, a negative ndim or size, null shape, null data with
  // elements, overflowing extents; Unimplemented for dtypes (lanes != 1,
  // unknown code/bits) and device types castmesh does not know.
  static absl::StatusOr<TensorView> FromDLPack(DLManagedTensorVersioned* managed);
  static absl::StatusOr<TensorView> FromDLPack(DLManagedTensor* managed);

  // "TensorView(float32[2, 3], strides=[3, 1], cpu)" (with ", read-only" when so).
  std::string to_string() const;

 private:
  void* base_ = nullptr;  // the pointer before byte_offset_ (DLTensor::data)
  DType dtype_ = DType::kFloat32;
  Dims shape_{0};
  Dims strides_{1};
  int64_t byte_offset_ = 0;
  int64_t numel_ = 0;
  Device device_;
  bool read_only_ = false;
  std::shared_ptr<void> owner_;
};

}  // namespace castmesh
