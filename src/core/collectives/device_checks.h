// Argument checks and backend codes of device collectives: which dtypes and
// reductions NCCL/RCCL have, and the errors for the ones they lack. Pure
// functions; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "castmesh/communicator.h"
#include "castmesh/tensor.h"

namespace castmesh::collectives {

// What a user whose buffers a device collective cannot take should do instead.
inline constexpr absl::string_view kStageHint =
    "copy the buffers to the host (castmesh::device_copy / .cpu()) and call the same collective there";

// The backend's dtype code of `dtype`, if NCCL/RCCL have it.
std::optional<int32_t> te_dtype(DType dtype);
// The backend's (dtype, op) of a device reduction, or the error saying why not.
absl::StatusOr<std::pair<int32_t, int32_t>> reduction_of(DType dtype, const ReduceSpec& spec);
// A used device buffer: CUDA/ROCm memory on `device`, contiguous, writable
// where written.
absl::Status check_device_buffer(const TensorView& t, absl::string_view what, const Device& device, bool written);
// `t` has `expected` elements.
absl::Status check_count(const TensorView& t, absl::string_view what, size_t expected);
// `root` is a rank of a group of `size`.
absl::Status check_root(int root, int size);
// The collective's name in errors and descriptors, e.g.
// "device allreduce(sum, float32, count=4)".
std::string describe(absl::string_view name, absl::string_view op, const TensorView& t, int root = -1);

}  // namespace castmesh::collectives
