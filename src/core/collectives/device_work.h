// The record of one device collective after its enqueue (DeviceWork: the
// event recorded after it, the buffers it keeps alive, the Request's state),
// the pool its events are reused from, and the collective number + descriptor
// receive it took (DeviceCall). A Request on device buffers holds a
// DeviceWork; the watchdog (device_comm.h) polls it. Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
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


// Runs a blocking backend call (a device synchronize, a collective init) so
// that a pooled actor's worker is handed on meanwhile. Any thread.
absl::Status run_handing_worker_on(absl::FunctionRef<absl::Status()> call);

}  // namespace castmesh::detail
