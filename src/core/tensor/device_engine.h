// The loaded tensor_engine backend as the core uses it: its table, the kind
// of device it drives and how many, and the translation of its errors.
// Loaded at the first use by a device tensor; never unloaded. Any thread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "castmesh/backend_abi.h"
#include "castmesh/tensor.h"

namespace castmesh::detail {

// The tensor_engine backend's table and what it drives. Immutable.
struct DeviceEngine {
  const castmesh_tensor_engine_table_v1* table = nullptr;
  DeviceKind kind = DeviceKind::kCuda;  // kCuda or kRocm
  int device_count = 0;
  std::string version;
};

// True for memory a tensor_engine backend drives (CUDA or ROCm device memory).
bool is_engine_device(const Device& device);

// The engine, loading the backend at first use. FailedPrecondition with the
// install hint when it is unavailable; `what` names the caller's object.
absl::StatusOr<const DeviceEngine*> device_engine(absl::string_view what);
// The engine, checked to drive `device`: InvalidArgument for another kind or
// an index the backend did not report.
absl::StatusOr<const DeviceEngine*> device_engine_for(const Device& device, absl::string_view what);

// True when `table` has the native-stream entries (stream_wrap,
// stream_native) that later 1.1 plugins append; earlier ones end at group_end.
bool has_native_streams(const castmesh_tensor_engine_table_v1& table);

// A backend failure as a Status ("<call>: <the backend's message>").
absl::Status backend_status(int32_t code, const castmesh_error_v1& error, absl::string_view call);

// How a call that blocks until device work is done (stream or event
// synchronize) runs. The runtime (core/collectives) sets one that hands a
// pooled actor's worker on meanwhile: that work may be a collective waiting
// for actors queued behind this one. The tensor layer sees nothing of the
// scheduler, hence the indirection. Set once, before actors run; any thread.
using BlockingCallWrapper = absl::Status (*)(absl::FunctionRef<absl::Status()> call);
void set_blocking_call_wrapper(BlockingCallWrapper wrapper);
// Runs `call` through the wrapper, or as is when none is set. Any thread.
absl::Status run_blocking_call(absl::FunctionRef<absl::Status()> call);

}  // namespace castmesh::detail
