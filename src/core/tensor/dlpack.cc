// TensorView <-> DLPack (castmesh/dlpack.h): dtype mapping, export with a
// context that owns the description arrays and the view's owner, and import
// that ties the producer's deleter to the view's owner.
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "castmesh/tensor.h"

namespace castmesh {
namespace {

// What an exported managed tensor points into: a copy of the view (its
// shape/strides arrays back DLTensor::shape/strides, its owner keeps the
// memory alive). Freed by the deleter.
template <typename Managed>
struct ExportContext {
  Managed managed{};
  TensorView view;

  static void Delete(Managed* self) { delete static_cast<ExportContext*>(self->manager_ctx); }
};

// The first DLTensor fields castmesh never changes between the two forms.
DLTensor describe(const TensorView& view, void* base) {
  DLTensor tensor{};
  tensor.data = base;
  tensor.device = DLDevice{static_cast<DLDeviceType>(view.device().kind), view.device().index};
  tensor.ndim = static_cast<int32_t>(view.ndim());
  tensor.dtype = dtype_to_dlpack(view.dtype());
  // DLPack wants mutable pointers; consumers only read them.
  tensor.shape = const_cast<int64_t*>(view.shape().data());
  tensor.strides = const_cast<int64_t*>(view.strides().data());
  tensor.byte_offset = static_cast<uint64_t>(view.byte_offset());
  return tensor;
}

std::string describe_dtype(DLDataType dtype) {
  return absl::StrCat("(code=", static_cast<int>(dtype.code), ", bits=", static_cast<int>(dtype.bits),
                      ", lanes=", static_cast<int>(dtype.lanes), ")");
}

// A validated TensorView of `tensor`; `owner` releases the managed tensor.
absl::StatusOr<TensorView> view_of(const DLTensor& tensor, std::shared_ptr<void> owner, bool read_only) {
  if (tensor.ndim < 0) return absl::InvalidArgumentError(absl::StrCat("DLPack tensor has ndim ", tensor.ndim));
  if (tensor.ndim > 0 && tensor.shape == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("DLPack tensor has ndim ", tensor.ndim, " but a null shape"));
  }
  if (tensor.dtype.lanes != 1) {
    return absl::UnimplementedError(absl::StrCat("DLPack dtype ", describe_dtype(tensor.dtype),
                                                 " has several lanes; castmesh supports single-lane dtypes only"));
  }
  std::optional<DType> dtype = dtype_from_dlpack(tensor.dtype);
  if (!dtype) {
    return absl::UnimplementedError(absl::StrCat("DLPack dtype ", describe_dtype(tensor.dtype),
                                                 " is not supported by castmesh (supported: int8-64, uint8-64, "
                                                 "float16/32/64, bfloat16, bool)"));
  }
  std::optional<DeviceKind> kind = device_kind_from_dlpack(tensor.device.device_type);
  if (!kind) {
    return absl::UnimplementedError(
        absl::StrCat("DLPack device type ", static_cast<int32_t>(tensor.device.device_type), " is unknown to castmesh"));
  }
  if (tensor.byte_offset > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("DLPack byte_offset ", tensor.byte_offset, " exceeds 2^63"));
  }
  const auto ndim = static_cast<size_t>(tensor.ndim);
  const absl::Span<const int64_t> shape(tensor.shape, ndim);
  // Null strides: compact row-major.
  const absl::Span<const int64_t> strides(tensor.strides, tensor.strides == nullptr ? 0 : ndim);
  return TensorView::Create(tensor.data, *dtype, shape, strides,
                            Device{*kind, tensor.device.device_id}, std::move(owner), read_only,
                            static_cast<int64_t>(tensor.byte_offset));
}

// An owner that hands `managed` back to its producer exactly once.
template <typename Managed>
std::shared_ptr<void> release_on_last_copy(Managed* managed) {
  return std::shared_ptr<void>(managed, [](void* p) {
    auto* self = static_cast<Managed*>(p);
    if (self->deleter != nullptr) self->deleter(self);
  });
}

}  // namespace

DLDataType dtype_to_dlpack(DType dtype) {
  const auto bits = static_cast<uint8_t>(dtype_size(dtype) * 8);
  if (dtype == DType::kBool) return DLDataType{kDLBool, 8, 1};
  if (dtype == DType::kBFloat16) return DLDataType{kDLBfloat, 16, 1};
  if (dtype_is_float(dtype)) return DLDataType{kDLFloat, bits, 1};
  if (dtype_is_unsigned_int(dtype)) return DLDataType{kDLUInt, bits, 1};
  return DLDataType{kDLInt, bits, 1};
}

std::optional<DType> dtype_from_dlpack(DLDataType dtype) {
  if (dtype.lanes != 1) return std::nullopt;
  for (DType candidate : kAllDTypes) {
    const DLDataType known = dtype_to_dlpack(candidate);
    if (known.code == dtype.code && known.bits == dtype.bits) return candidate;
  }
  return std::nullopt;
}

DLManagedTensorVersioned* TensorView::to_dlpack_versioned() const {
  auto* context = new ExportContext<DLManagedTensorVersioned>{{}, *this};
  DLManagedTensorVersioned& managed = context->managed;
  managed.version = DLPackVersion{kDLPackMajorVersion, kDLPackMinorVersion};
  managed.manager_ctx = context;
  managed.deleter = &ExportContext<DLManagedTensorVersioned>::Delete;
  managed.flags = read_only_ ? kDLPackFlagBitmaskReadOnly : 0;
  managed.dl_tensor = describe(context->view, base_);
  return &managed;
}

DLManagedTensor* TensorView::to_dlpack_legacy() const {
  auto* context = new ExportContext<DLManagedTensor>{{}, *this};
  DLManagedTensor& managed = context->managed;
  managed.manager_ctx = context;
  managed.deleter = &ExportContext<DLManagedTensor>::Delete;
  managed.dl_tensor = describe(context->view, base_);
  return &managed;
}

absl::StatusOr<TensorView> TensorView::FromDLPack(DLManagedTensorVersioned* managed) {
  if (managed == nullptr) return absl::InvalidArgumentError("null DLManagedTensorVersioned");
  // Owned from here on, so every error below also releases it.
  std::shared_ptr<void> owner = release_on_last_copy(managed);
  if (managed->version.major != kDLPackMajorVersion) {
    return absl::InvalidArgumentError(absl::StrCat("DLPack version ", managed->version.major, ".",
                                                   managed->version.minor, " is not supported; castmesh reads ",
                                                   kDLPackMajorVersion, ".x"));
  }
  const bool read_only = (managed->flags & kDLPackFlagBitmaskReadOnly) != 0;
  return view_of(managed->dl_tensor, std::move(owner), read_only);
}

absl::StatusOr<TensorView> TensorView::FromDLPack(DLManagedTensor* managed) {
  if (managed == nullptr) return absl::InvalidArgumentError("null DLManagedTensor");
  std::shared_ptr<void> owner = release_on_last_copy(managed);
  return view_of(managed->dl_tensor, std::move(owner), false);
}

}  // namespace castmesh
