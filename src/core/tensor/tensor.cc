// TensorView construction, validation and copying (DLPack lives in dlpack.cc).
#include "castmesh/tensor.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace castmesh {
namespace {

constexpr size_t kAllocAlignment = 64;

// Contract violations of the non-Status constructors: say why, then stop.
[[noreturn]] void die(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "castmesh: %s: %s\n", what, std::string(status.message()).c_str());
  std::abort();
}

// numel of a shape, or an error for a negative size or an overflowing count.
absl::StatusOr<int64_t> count_elements(absl::Span<const int64_t> shape, size_t itemsize) {
  int64_t numel = 1;
  bool empty = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) return absl::InvalidArgumentError(absl::StrCat("shape[", i, "] is ", shape[i], "; sizes must be >= 0"));
    empty = empty || shape[i] == 0;
    // Sizes beside a zero still must not overflow alone, but the product
    // of an empty tensor's sizes is irrelevant.
    if (!empty && __builtin_mul_overflow(numel, shape[i], &numel)) {
      return absl::InvalidArgumentError(absl::StrCat("shape [", absl::StrJoin(shape, ", "), "] has more than 2^63 elements"));
    }
  }
  if (empty) return 0;
  int64_t bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(itemsize), &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("shape [", absl::StrJoin(shape, ", "), "] needs more than 2^63 bytes"));
  }
  return numel;
}

// C-contiguous strides (in elements) of a shape whose numel did not overflow.
TensorView::Dims contiguous_strides(absl::Span<const int64_t> shape) {
  TensorView::Dims strides(shape.size());
  int64_t step = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = step;
    step *= shape[i] > 0 ? shape[i] : 1;
  }
  return strides;
}

// The lowest and highest byte offsets (from the first element) any element
// reaches must fit in int64 together with byte_offset, so that consumers
// doing pointer arithmetic in int64 never overflow.
absl::Status check_extent(absl::Span<const int64_t> shape, absl::Span<const int64_t> strides,
                          size_t itemsize, int64_t byte_offset) {
  int64_t low = 0;
  int64_t high = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t span = 0;
    bool overflow = __builtin_mul_overflow(strides[i], shape[i] - 1, &span);
    overflow = overflow || __builtin_add_overflow(span < 0 ? low : high, span, span < 0 ? &low : &high);
    if (overflow) {
      return absl::InvalidArgumentError(absl::StrCat("strides [", absl::StrJoin(strides, ", "), "] over shape [",
                                                     absl::StrJoin(shape, ", "), "] overflow 64-bit offsets"));
    }
  }
  const auto item = static_cast<int64_t>(itemsize);
  int64_t low_bytes = 0;
  int64_t high_bytes = 0;
  if (__builtin_mul_overflow(low, item, &low_bytes) || __builtin_mul_overflow(high, item, &high_bytes) ||
      __builtin_add_overflow(low_bytes, byte_offset, &low_bytes) ||
      __builtin_add_overflow(high_bytes, byte_offset, &high_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("strides [", absl::StrJoin(strides, ", "), "] over shape [",
                                                   absl::StrJoin(shape, ", "), "] with byte offset ", byte_offset,
                                                   " overflow 64-bit byte offsets"));
  }
  return absl::OkStatus();
}

// Copies every element of `src` (host-accessible) to the dense `dst`, in C order.
void copy_strided(const char* src, absl::Span<const int64_t> shape, absl::Span<const int64_t> strides,
                  size_t itemsize, size_t dim, char*& dst) {
  if (dim == shape.size()) {
    std::memcpy(dst, src, itemsize);
    dst += itemsize;
    return;
  }
  const int64_t step = strides[dim] * static_cast<int64_t>(itemsize);
  if (dim + 1 == shape.size() && step == static_cast<int64_t>(itemsize)) {  // dense innermost run
    std::memcpy(dst, src, static_cast<size_t>(shape[dim]) * itemsize);
    dst += static_cast<size_t>(shape[dim]) * itemsize;
    return;
  }
  for (int64_t i = 0; i < shape[dim]; ++i) copy_strided(src + i * step, shape, strides, itemsize, dim + 1, dst);
}

}  // namespace

std::optional<DeviceKind> device_kind_from_dlpack(int32_t code) {
  switch (code) {
    case kDLCPU: case kDLCUDA: case kDLCUDAHost: case kDLOpenCL: case kDLVulkan: case kDLMetal: case kDLVPI:
    case kDLROCM: case kDLROCMHost: case kDLExtDev: case kDLCUDAManaged: case kDLOneAPI: case kDLWebGPU:
    case kDLHexagon:
      return static_cast<DeviceKind>(code);
    default:
      return std::nullopt;
  }
}

const char* device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu: return "cpu";
    case DeviceKind::kCuda: return "cuda";
    case DeviceKind::kCudaHost: return "cuda_host";
    case DeviceKind::kOpenCl: return "opencl";
    case DeviceKind::kVulkan: return "vulkan";
    case DeviceKind::kMetal: return "metal";
    case DeviceKind::kVpi: return "vpi";
    case DeviceKind::kRocm: return "rocm";
    case DeviceKind::kRocmHost: return "rocm_host";
    case DeviceKind::kExtDev: return "ext_dev";
    case DeviceKind::kCudaManaged: return "cuda_managed";
    case DeviceKind::kOneApi: return "oneapi";
    case DeviceKind::kWebGpu: return "webgpu";
    case DeviceKind::kHexagon: return "hexagon";
  }
  return "unknown";
}

bool Device::is_host_accessible() const {
  return kind == DeviceKind::kCpu || kind == DeviceKind::kCudaHost || kind == DeviceKind::kRocmHost ||
         kind == DeviceKind::kCudaManaged;
}

std::string Device::to_string() const {
  if (is_cpu() && index == 0) return "cpu";
  return absl::StrCat(device_kind_name(kind), ":", index);
}

TensorView::TensorView() = default;

absl::StatusOr<TensorView> TensorView::Create(void* data, DType dtype, absl::Span<const int64_t> shape,
                                              absl::Span<const int64_t> strides, Device device,
                                              std::shared_ptr<void> owner, bool read_only, int64_t byte_offset) {
  if (dtype_size(dtype) == 0) return absl::InvalidArgumentError("invalid DType value");
  absl::StatusOr<int64_t> numel = count_elements(shape, dtype_size(dtype));
  if (!numel.ok()) return numel.status();
  TensorView view;
  if (strides.empty()) {
    view.strides_ = contiguous_strides(shape);
  } else if (strides.size() != shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat("strides has ", strides.size(), " entries but shape has ",
                                                   shape.size(), " dimensions"));
  } else {
    view.strides_.assign(strides.begin(), strides.end());
  }
  if (byte_offset < 0) return absl::InvalidArgumentError(absl::StrCat("byte offset ", byte_offset, " is negative"));
  if (*numel > 0) {
    if (data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("null data pointer for ", *numel, " elements"));
    }
    if (absl::Status extent = check_extent(shape, view.strides_, dtype_size(dtype), byte_offset); !extent.ok()) {
      return extent;
    }
  }
  view.base_ = data;
  view.dtype_ = dtype;
  view.shape_.assign(shape.begin(), shape.end());
  view.byte_offset_ = byte_offset;
  view.numel_ = *numel;
  view.device_ = device;
  view.read_only_ = read_only;
  view.owner_ = std::move(owner);
  return view;
}

TensorView TensorView::Contiguous(void* data, DType dtype, absl::Span<const int64_t> shape,
                                  std::shared_ptr<void> owner, bool read_only) {
  absl::StatusOr<TensorView> view = Create(data, dtype, shape, {}, Device{}, std::move(owner), read_only, 0);
  if (!view.ok()) die("TensorView::Contiguous", view.status());
  return *std::move(view);
}

absl::StatusOr<TensorView> TensorView::TryAllocate(DType dtype, absl::Span<const int64_t> shape) {
  absl::StatusOr<int64_t> numel = count_elements(shape, dtype_size(dtype));
  if (!numel.ok()) return numel.status();
  const size_t bytes = static_cast<size_t>(*numel) * dtype_size(dtype);
  // aligned_alloc wants a multiple of the alignment; never 0 so data() of an
  // allocated view is always a real pointer.
  if (bytes > std::numeric_limits<size_t>::max() - kAllocAlignment) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  const size_t rounded = (bytes / kAllocAlignment + 1) * kAllocAlignment;
  void* memory = std::aligned_alloc(kAllocAlignment, rounded);
  if (memory == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  std::memset(memory, 0, rounded);
  std::shared_ptr<void> owner(memory, [](void* p) { std::free(p); });
  return Create(memory, dtype, shape, {}, Device{}, std::move(owner), false, 0);
}

TensorView TensorView::Allocate(DType dtype, absl::Span<const int64_t> shape) {
  absl::StatusOr<TensorView> view = TryAllocate(dtype, shape);
  if (!view.ok()) die("TensorView::Allocate", view.status());
  return *std::move(view);
}

void* TensorView::data() const {
  if (base_ == nullptr) return nullptr;
  return static_cast<char*>(base_) + byte_offset_;
}

bool TensorView::is_contiguous() const {
  if (numel_ <= 1) return true;
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

absl::StatusOr<TensorView> TensorView::ContiguousCopy() const {
  if (!device_.is_host_accessible()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot copy a ", device_.to_string(), " tensor on the CPU; only host memory can be copied here"));
  }
  absl::StatusOr<TensorView> copy = TryAllocate(dtype_, shape_);
  if (!copy.ok() || numel_ == 0) return copy;
  char* dst = static_cast<char*>(copy->data());
  copy_strided(static_cast<const char*>(data()), shape_, strides_, itemsize(), 0, dst);
  return copy;
}

TensorView TensorView::with_owner(std::shared_ptr<void> owner) const {
  TensorView view = *this;
  view.owner_ = std::move(owner);
  return view;
}

std::string TensorView::to_string() const {
  return absl::StrCat("TensorView(", std::string(dtype_name(dtype_)), "[", absl::StrJoin(shape_, ", "), "], strides=[",
                      absl::StrJoin(strides_, ", "), "], ", device_.to_string(), read_only_ ? ", read-only" : "", ")");
}

}  // namespace castmesh
