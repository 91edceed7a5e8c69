// The device communicator of one communicator (CommGroup) on this rank
// (DeviceComm: the backend's NCCL/RCCL communicator, its own stream, its
// pending work), the process's registry of them, and its watchdog: one
// service thread that polls pending work, the backend's asynchronous error
// and each collective's deadline, and on a failure fails every pending
// request of the communicator naming the cause, then aborts it.
// Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "castmesh/communicator.h"
#include "castmesh/detail/mutex.h"
#include "core/collectives/device_work.h"

namespace castmesh::detail {

// The device communicator of one group on this rank.
class DeviceComm : public std::enable_shared_from_this<DeviceComm> {
 public:
  using Enqueue = std::function<int32_t(castmesh_te_comm_v1*, castmesh_te_stream_v1*, castmesh_error_v1*)>;

  DeviceComm(const DeviceEngine* engine, Device device, std::string name, castmesh_te_comm_v1* comm,
             DeviceStream own_stream)
      : engine_(engine),
        device_(device),
        name_(std::move(name)),
        own_stream_(std::move(own_stream)),
        events_(std::make_shared<DeviceEventPool>(engine, device)),
        comm_(comm) {}

  // Frees the backend communicator (its group is gone and no work is
  // pending: the watchdog holds communicators with pending work).
  ~DeviceComm() {
    castmesh_error_v1 error{};
    if (comm_ != nullptr) engine_->table->comm_destroy(comm_, &error);
  }
  DeviceComm(const DeviceComm&) = delete;
  DeviceComm& operator=(const DeviceComm&) = delete;

  Device device() const { return device_; }

  // Enqueues one collective (`enqueue` makes the backend calls) and the
  // event after it; the request completes when the event does.
  // A failure before the enqueue aborts collective `call` on every rank.
  Request launch(std::string what, std::vector<TensorView> keep, const DeviceOptions& options, const Enqueue& enqueue,
                 DeviceCall call);
  // One watchdog pass; true while work is pending.
  bool watch();

 private:
  // Fails every pending request with `why`, then aborts the communicator.
  void fail(const absl::Status& why);
  // When another rank called something else at the number of one of
  // `works`, aborted it, or (its descriptor receive failing) is gone, fails
  // the communicator saying so (true).
  bool fail_mismatched(const std::vector<std::shared_ptr<DeviceWork>>& works);

  const DeviceEngine* engine_;
  const Device device_;
  const std::string name_;
  const DeviceStream own_stream_;
  const std::shared_ptr<DeviceEventPool> events_;
  Mutex mu_;
  castmesh_te_comm_v1* comm_ ABSL_GUARDED_BY(mu_);  // null once aborted
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<DeviceWork>> pending_ ABSL_GUARDED_BY(mu_);
};

// The process's watchdog thread and the device communicators of live groups.
// Never destroyed (its thread runs until exit). Thread-safe.
class DeviceRegistry {
 public:
  static DeviceRegistry& get();

  // The group's slot, made on first use (slots of dead groups are dropped).
  struct Slot {
    Mutex mu;
    std::shared_ptr<DeviceComm> comm ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<Slot> slot(CommGroup& group);

  // Has the watchdog poll `comm` until its work is done.
  void watch(const std::shared_ptr<DeviceComm>& comm);

 private:
  struct Entry {
    std::weak_ptr<CommGroup> group;
    std::shared_ptr<Slot> slot;
  };

  DeviceRegistry() = default;
  // The watchdog thread's loop.
  void run();

  static constexpr absl::Duration kLinger = absl::Milliseconds(20);

  Mutex mu_;
  CondVar cv_;
  std::map<const CommGroup*, Entry> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<DeviceComm>> watched_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool asleep_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_work_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// A device collective that failed on this rank before its enqueue: the
// other ranks may have enqueued theirs, which would wait for this rank until
// the deadline, so the collective is aborted on every rank.
Request given_up(const DeviceCall& call, absl::Status why);

// The group's device communicator on `device`, made at the first call
// (collective: every rank calls it at the same point; `checked` is this
// rank's argument check, shared so a refused call fails on every rank).
// Made in device_comm_init.cc. Caller's thread.
absl::StatusOr<std::shared_ptr<DeviceComm>> comm_for(CommGroup& group, const DeviceEngine* engine, Device device,
                                                     const absl::Status& checked, absl::Duration timeout,
                                                     const DeviceCall& call, const std::string& what);

}  // namespace castmesh::detail
