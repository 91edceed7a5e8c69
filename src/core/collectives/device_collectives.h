// Collectives on device (CUDA/ROCm) buffers: the Communicator's calls on
// TensorViews of device memory go to the tensor_engine backend (NCCL/RCCL)
// instead of the CPU algorithms. docs/collectives.md, "Device buffers".
//
// Per communicator (CommGroup) and rank, a device communicator is made at the
// first device collective: rank 0 makes the backend's unique id and every
// rank receives it through a host allgather over the same group (with every
// rank's device and argument check), so split, dup and concurrent
// communicators never mix ids. Each collective is enqueued on the caller's
// stream (or the communicator's own), followed by an event; the Request
// completes when the event has. A process-wide watchdog polls pending work,
// the backend's asynchronous error and each collective's deadline; on an
// error or a hung peer it fails every pending request of the communicator
// naming the cause, then aborts the device communicator (later device
// collectives on it fail; host collectives keep working).
//
// Mismatches: each device collective takes the next collective number, as a
// host collective does, and sends a descriptor (its signature, no body) to
// the next rank, fire-and-forget, while it receives the previous rank's. A
// rank that called something else at that number meets the descriptor in
// its mailbox (rank_mailbox.h, kDescriptorStep): a host collective's receive
// fails there, a device call's descriptor receive fails here; either way the
// collective is aborted on every rank and the device communicators with it.
//
// Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "castmesh/communicator.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/tensor_engine.h"
#include "core/tensor/device_engine.h"

namespace castmesh::detail {

class CommGroup;
class RequestState;

// One device collective as the host channel sees it: its collective number
// (taken like a host collective's, so host and device calls share one
// numbering) and the receive of the previous rank's descriptor of it (null
// with one rank). Made by the caller's thread; read by the watchdog.
struct DeviceCall {
  std::weak_ptr<CommGroup> group;
  uint64_t sequence = 0;
  std::shared_ptr<RequestState> descriptor;
};

// Events of one device communicator, reused from call to call: creating and
// destroying one per collective costs two driver calls on the hot path.
// Idle events are destroyed with the pool (the last DeviceWork or the
// communicator to let go of it). Thread-safe.
class DeviceEventPool {
 public:
  DeviceEventPool(const DeviceEngine* engine, Device device) : engine_(engine), device_(device) {}
  ~DeviceEventPool();
  DeviceEventPool(const DeviceEventPool&) = delete;
  DeviceEventPool& operator=(const DeviceEventPool&) = delete;

  // An idle event, or a new one. Any thread.
  absl::StatusOr<castmesh_te_event_v1*> take();
  // Returns an event nothing waits on any more (its work was destroyed).
  void give_back(castmesh_te_event_v1* event);

 private:
  static constexpr size_t kMaxIdle = 64;

  const DeviceEngine* engine_;
  const Device device_;
  Mutex mu_;
  std::vector<castmesh_te_event_v1*> idle_ ABSL_GUARDED_BY(mu_);
};

// One collective enqueued on a device stream: the event recorded after it,
// the buffers (and stream) it keeps alive until the event completed, and the
// request the caller holds. Shared by the Request and the watchdog.
class DeviceWork {
 public:
  DeviceWork(const DeviceEngine* engine, Device device, std::string what, absl::Time deadline,
             std::shared_ptr<DeviceEventPool> events, castmesh_te_event_v1* event, std::vector<TensorView> keep,
             DeviceStream stream, DeviceCall call);
  ~DeviceWork();
  DeviceWork(const DeviceWork&) = delete;
  DeviceWork& operator=(const DeviceWork&) = delete;

  // Queries the event; once the work has run, completes the request (OK
  // unless it already failed) and releases the buffers. True once run.
  bool poll();
  // Request::wait for device work: polls until complete or `timeout`.
  absl::StatusOr<MessageStatus> wait(absl::Duration timeout);
  // Request::wait_stream: `stream` waits for the event (no host wait).
  absl::Status order_before(const DeviceStream& stream);
  // Fails the request with `why` (ignored once complete).
  void fail(const absl::Status& why);
  // Whether the previous rank's descriptor has arrived (or none is expected).
  bool confirmed() const;
  // Why another rank calls something else at this collective number: the
  // previous rank's descriptor disagreed (`found_here` set: this rank must
  // tell the others), or a rank aborted the collective. OK otherwise.
  // Watchdog thread.
  absl::Status conflict(bool* found_here) const;
  const DeviceCall& call() const { return call_; }

  const std::shared_ptr<RequestState>& state() const { return state_; }
  const std::string& what() const { return what_; }
  absl::Time deadline() const { return deadline_; }

 private:
  const DeviceEngine* engine_;
  Device device_;
  std::string what_;
  absl::Time deadline_;
  const std::shared_ptr<DeviceEventPool> events_;
  castmesh_te_event_v1* event_;
  const DeviceCall call_;
  std::shared_ptr<RequestState> state_;
  Mutex mu_;
  bool ran_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<TensorView> keep_ ABSL_GUARDED_BY(mu_);
  DeviceStream stream_ ABSL_GUARDED_BY(mu_);
};

}  // namespace castmesh::detail

namespace castmesh::collectives {

// True when either view is CUDA/ROCm memory: the collective takes the device path.
bool on_device(const TensorView& a, const TensorView& b);

// The device collectives behind Communicator's calls (same arguments). Each
// returns at once; errors, local or from the backend, are in the Request.
Request device_allreduce(detail::CommGroup& group, const TensorView& in, const TensorView& out, const ReduceSpec& op,
                         const DeviceOptions& options);
Request device_reduce(detail::CommGroup& group, const TensorView& in, const TensorView& out, const ReduceSpec& op,
                      int root, const DeviceOptions& options);
Request device_broadcast(detail::CommGroup& group, const TensorView& data, int root, const DeviceOptions& options);
Request device_allgather(detail::CommGroup& group, const TensorView& in, const TensorView& out,
                         const DeviceOptions& options);
Request device_gather(detail::CommGroup& group, const TensorView& in, const TensorView& out, int root,
                      const DeviceOptions& options);
Request device_scatter(detail::CommGroup& group, const TensorView& in, const TensorView& out, int root,
                       const DeviceOptions& options);
Request device_reduce_scatter(detail::CommGroup& group, const TensorView& in, const TensorView& out,
                              const ReduceSpec& op, const DeviceOptions& options);
Request device_alltoall(detail::CommGroup& group, const TensorView& in, const TensorView& out,
                        const DeviceOptions& options);

// The error for a device buffer `what` given to host-only operation `op`
// (point to point: tags, any-source and probe have no device equivalent).
absl::Status host_only(const TensorView& t, absl::string_view what, absl::string_view op);

}  // namespace castmesh::collectives
