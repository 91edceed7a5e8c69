// Argument checks and backend codes of device collectives (device_checks.h).
#include "core/collectives/device_checks.h"

#include "absl/strings/str_cat.h"
#include "castmesh/backend_abi.h"
#include "castmesh/tensor_engine.h"

namespace castmesh::collectives {

std::optional<int32_t> te_dtype(DType dtype) {
  switch (dtype) {
    case DType::kInt8:
      return CASTMESH_TE_DTYPE_INT8;
    case DType::kUInt8:
      return CASTMESH_TE_DTYPE_UINT8;
    case DType::kInt32:
      return CASTMESH_TE_DTYPE_INT32;
    case DType::kUInt32:
      return CASTMESH_TE_DTYPE_UINT32;
    case DType::kInt64:
      return CASTMESH_TE_DTYPE_INT64;
    case DType::kUInt64:
      return CASTMESH_TE_DTYPE_UINT64;
    case DType::kFloat16:
      return CASTMESH_TE_DTYPE_FLOAT16;
    case DType::kBFloat16:
      return CASTMESH_TE_DTYPE_BFLOAT16;
    case DType::kFloat32:
      return CASTMESH_TE_DTYPE_FLOAT32;
    case DType::kFloat64:
      return CASTMESH_TE_DTYPE_FLOAT64;
    default:
      return std::nullopt;
  }
}

// The backend's (dtype, op) of a device reduction, or the error saying why not.
absl::StatusOr<std::pair<int32_t, int32_t>> reduction_of(DType dtype, const ReduceSpec& spec) {
  std::optional<ReduceOp> op = spec.builtin();
  if (!op) {
    return absl::UnimplementedError(
        absl::StrCat("user-defined reduction '", spec.name(),
                     "' runs on the CPU only (NCCL/RCCL have no user reductions): ", kStageHint));
  }
  std::optional<int32_t> te = te_dtype(dtype);
  if (!te) {
    return absl::UnimplementedError(absl::StrCat("NCCL/RCCL have no ", std::string(dtype_name(dtype)),
                                                 " reductions: ", kStageHint, " (or cast the tensor)"));
  }
  const bool floating =
      dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32 || dtype == DType::kFloat64;
  switch (*op) {
    case ReduceOp::kSum:
      return std::make_pair(*te, int32_t{CASTMESH_TE_REDUCE_SUM});
    case ReduceOp::kProd:
      return std::make_pair(*te, int32_t{CASTMESH_TE_REDUCE_PROD});
    case ReduceOp::kMin:
      return std::make_pair(*te, int32_t{CASTMESH_TE_REDUCE_MIN});
    case ReduceOp::kMax:
      return std::make_pair(*te, int32_t{CASTMESH_TE_REDUCE_MAX});
    case ReduceOp::kAvg:
      if (!floating) {
        return absl::InvalidArgumentError(
            absl::StrCat("avg of ", std::string(dtype_name(dtype)), " makes no sense; use sum"));
      }
      return std::make_pair(*te, int32_t{CASTMESH_TE_REDUCE_AVG});
    default:
      return absl::UnimplementedError(
          absl::StrCat("reduction '", spec.name(), "' (bitwise/logical) has no NCCL/RCCL equivalent: ", kStageHint));
  }
}

// A used device buffer: CUDA/ROCm memory on `device`, contiguous, writable
// where written.
absl::Status check_device_buffer(const TensorView& t, absl::string_view what, const Device& device, bool written) {
  if (t.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is on ", t.device().to_string(),
                                                   " but the other buffers on ", device.to_string(),
                                                   ": every buffer of a device collective is on "
                                                   "the rank's one device"));
  }
  if (!t.is_contiguous())
    return absl::InvalidArgumentError(absl::StrCat(what, " is not contiguous (", t.to_string(), ")"));
  if (written && t.read_only()) return absl::InvalidArgumentError(absl::StrCat(what, " is read-only"));
  return absl::OkStatus();
}

absl::Status check_count(const TensorView& t, absl::string_view what, size_t expected) {
  if (static_cast<size_t>(t.numel()) == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " has ", t.numel(), " elements, expected ", expected));
}

absl::Status check_root(int root, int size) {
  if (root >= 0 && root < size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("root ", root, " is not a rank (0..", size - 1, ")"));
}

std::string describe(absl::string_view name, absl::string_view op, const TensorView& t, int root) {
  std::string s = absl::StrCat("device ", name, "(");
  if (!op.empty()) absl::StrAppend(&s, op, ", ");
  absl::StrAppend(&s, std::string(dtype_name(t.dtype())), ", count=", t.numel());
  if (root >= 0) absl::StrAppend(&s, ", root=", root);
  return s + ")";
}

}  // namespace castmesh::collectives
