// Device memory, streams and copies through the tensor_engine backend (CUDA
// or ROCm, loaded at run time; docs/tensors.md "Device tensors"). Device
// collectives use the same Communicator calls as host buffers, on the stream
// a DeviceOptions names (castmesh/communicator.h).
//
// Without the backend (not installed, no driver, no GPU) every function here
// returns FailedPrecondition saying how to install it
// (pip install "castmesh[tensor-engine]"); the rest of castmesh keeps working.
//
// Threading: every function may be called from any thread; a DeviceStream is
// a cheap shared handle.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "castmesh/dtype.h"
#include "castmesh/tensor.h"

// The backend's stream, opaque here: only backends and castmesh itself look
// inside (castmesh/backend_abi.h, which user code of this header does not
// need and does not get).
struct castmesh_te_stream_v1;

namespace castmesh {

struct DeviceInfo;  // castmesh/backend.h: include it to read device_list()'s result

// A stream of the tensor_engine backend: device work enqueued on it runs in
// order. Copies share the stream; the last copy destroys it (after its
// pending work, which still runs). A default-made one is "no stream".
class DeviceStream {
 public:
  // No stream (valid() is false): device collectives then use the
  // communicator's own stream.
  DeviceStream() = default;
  // A new stream on `device` (kCuda or kRocm, the loaded backend's kind).
  static absl::StatusOr<DeviceStream> Create(Device device);
  // A handle for a stream the runtime made elsewhere: `native` is a
  // cudaStream_t / hipStream_t of `device` as an integer (a framework's
  // current stream), or the runtime's special values DLPack uses (CUDA: 1
  // legacy default, 2 per-thread default; ROCm: 0). Not owned: the native
  // stream must outlive every copy. FailedPrecondition for a plugin that
  // predates native streams.
  static absl::StatusOr<DeviceStream> FromNative(Device device, uintptr_t native);

  // True for a stream made by Create.
  bool valid() const { return impl_ != nullptr; }
  // The device whose work the stream orders (cpu for "no stream").
  Device device() const;
  // The backend's opaque handle (what its table's stream functions take),
  // valid while a copy of this DeviceStream lives.
  castmesh_te_stream_v1* handle() const;
  // The runtime's stream (cudaStream_t / hipStream_t) as an integer: what to
  // pass as DLPack's __dlpack__(stream=...) or to a framework's stream wrapper.
  absl::StatusOr<uintptr_t> native_handle() const;
  // Blocks the calling thread until the work enqueued so far has completed.
  absl::Status synchronize() const;
  // True when every piece of work enqueued so far has completed.
  absl::StatusOr<bool> query() const;

  // Shared state: the backend table and the handle (internal).
  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// An event of the tensor_engine backend: captures the work enqueued on a
// stream when recorded, completes when that work has. Copies share the event;
// the last copy destroys it. A default-made one is "no event".
class DeviceEvent {
 public:
  // No event (valid() is false).
  DeviceEvent() = default;
  // A new event on `device`; complete until first recorded.
  static absl::StatusOr<DeviceEvent> Create(Device device);

  // True for an event made by Create.
  bool valid() const { return impl_ != nullptr; }
  // The event's device (cpu for "no event").
  Device device() const;
  // Captures the work enqueued on `stream` (of the event's device) so far.
  absl::Status record(const DeviceStream& stream) const;
  // True when the captured work has completed.
  absl::StatusOr<bool> query() const;
  // Blocks the calling thread until the captured work has completed.
  absl::Status synchronize() const;
  // Work enqueued on `stream` after this call waits for the event (no host wait).
  absl::Status order_before(const DeviceStream& stream) const;

  // Shared state: the backend table and the handle (internal).
  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// The producer half of the DLPack stream protocol for castmesh-owned device
// memory: work enqueued on `consumer` after this call waits (event record +
// stream wait, no host wait) for the work castmesh has enqueued so far on
// every stream of `consumer`'s device that castmesh made or wrapped (copies,
// collectives). Called by __dlpack__(stream=...) before it hands a device
// tensor over.
absl::Status order_after_castmesh_work(const DeviceStream& consumer);

// The loaded tensor_engine backend's devices; FailedPrecondition (with the
// install hint) without it. DeviceInfo is castmesh/backend.h's (include it,
// or castmesh/castmesh.h, to use the result).
absl::StatusOr<std::vector<DeviceInfo>> device_list();

// A C-contiguous, uninitialised TensorView of device memory on `device`,
// freed when the last copy of the view (or a DLPack export) is gone. Free
// only after the work that uses it completed: keep a view alive (castmesh's
// own requests do) until then.
absl::StatusOr<TensorView> device_empty(DType dtype, std::vector<int64_t> shape, Device device);

// Copies `src` into `dst` (contiguous, same dtype and element count; host to
// device, device to host or device to device) in the order of `stream`,
// which must be on the device side's device. A host source may be reused
// when this returns; a host destination holds the data once the stream (or
// a request ordered after it) completed.
absl::Status device_copy(const TensorView& dst, const TensorView& src, const DeviceStream& stream);

}  // namespace castmesh
