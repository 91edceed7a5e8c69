// DeviceComm, DeviceRegistry and its watchdog (device_comm.h).
#include "core/collectives/device_comm.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/collectives/comm_group.h"
#include "core/collectives/handles.h"
#include "core/progress/progress_engine.h"
#include "core/progress/request_state.h"

namespace castmesh::detail {

// ---- DeviceRegistry and its watchdog ----

DeviceRegistry& DeviceRegistry::get() {
  static DeviceRegistry& registry = *new DeviceRegistry();  // never destroyed: its thread runs until exit
  return registry;
}

std::shared_ptr<DeviceRegistry::Slot> DeviceRegistry::slot(CommGroup& group) {
  MutexLock lock(mu_);
  for (auto it = slots_.begin(); it != slots_.end();) {
    it = it->second.group.expired() ? slots_.erase(it) : std::next(it);
  }
  Entry& entry = slots_[&group];
  if (entry.slot == nullptr) {
    entry.group = group.weak_from_this();
    entry.slot = std::make_shared<Slot>();
  }
  return entry.slot;
}

void DeviceRegistry::watch(const std::shared_ptr<DeviceComm>& comm) {
  MutexLock lock(mu_);
  watched_.push_back(comm);
  if (!started_) {
    started_ = true;
    // The registry lives until exit, and so does its thread.
    progress::ProgressEngine::instance().start_service("castmesh-watchdog", [this] { run(); });
  }
  // A watchdog that is not asleep polls again within a millisecond: waking
  // it costs the caller a syscall on every collective of a busy loop.
  if (asleep_) cv_.notify_all();
}

void DeviceRegistry::run() {
  while (true) {
    std::vector<std::shared_ptr<DeviceComm>> comms;
    {
      MutexLock lock(mu_);
      while (watched_.empty()) {
        // Between the calls of a busy loop it keeps polling (1 ms naps),
        // so callers need not wake it; after kLinger without work it
        // sleeps until woken.
        if (absl::Now() - last_work_ < kLinger) {
          cv_.wait_for(lock, absl::Milliseconds(1));
          continue;
        }
        asleep_ = true;
        cv_.wait(lock);
        asleep_ = false;
      }
      last_work_ = absl::Now();
      comms.swap(watched_);
    }
    std::vector<std::shared_ptr<DeviceComm>> busy;
    for (const std::shared_ptr<DeviceComm>& comm : comms) {
      if (comm->watch()) busy.push_back(comm);
    }
    MutexLock lock(mu_);
    for (std::shared_ptr<DeviceComm>& comm : busy) {
      if (std::find(watched_.begin(), watched_.end(), comm) == watched_.end()) watched_.push_back(std::move(comm));
    }
    if (!watched_.empty()) cv_.wait_for(lock, absl::Milliseconds(1));
  }
}

// ---- DeviceComm ----

Request given_up(const DeviceCall& call, absl::Status why) {
  if (std::shared_ptr<CommGroup> group = call.group.lock()) group->abort(call.sequence, why);
  return collectives_internal::Handles::request(RequestState::Done(std::move(why)));
}

Request DeviceComm::launch(std::string what, std::vector<TensorView> keep, const DeviceOptions& options,
                           const Enqueue& enqueue, DeviceCall call) {
  const DeviceStream& stream = options.stream.valid() ? options.stream : own_stream_;
  if (stream.device() != device_) {
    return given_up(call, absl::InvalidArgumentError(
                              absl::StrCat(what, ": the buffers are on ", device_.to_string(), " but the stream is on ",
                                           stream.device().to_string(), "; create the stream on the buffers' device")));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return given_up(call, absl::InvalidArgumentError(absl::StrCat(what, ": DeviceOptions.timeout must be positive")));
  }
  const castmesh_tensor_engine_table_v1& table = *engine_->table;
  castmesh_error_v1 error{};
  absl::StatusOr<castmesh_te_event_v1*> taken = events_->take();
  if (!taken.ok()) return given_up(call, absl::Status(taken.status().code(), absl::StrCat(what, ": ", taken.status().message())));
  castmesh_te_event_v1* event = *taken;
  std::shared_ptr<DeviceWork> work;
  {
    MutexLock lock(mu_);
    absl::Status st = failure_;
    if (!st.ok()) {
      st = absl::FailedPreconditionError(absl::StrCat(what, ": the device communicator of ", name_,
                                                      " was aborted after an earlier failure (", failure_.message(),
                                                      "); make a new communicator (dup/split) to go on"));
    }
    if (st.ok()) st = backend_status(enqueue(comm_, stream.handle(), &error), error, what);
    if (st.ok()) st = backend_status(table.event_record(event, stream.handle(), &error), error, "event_record");
    if (!st.ok()) {
      events_->give_back(event);
      return given_up(call, st);
    }
    work = std::make_shared<DeviceWork>(engine_, device_, std::move(what), absl::Now() + options.timeout, events_,
                                        event, std::move(keep), stream, std::move(call));
    pending_.push_back(work);
  }
  DeviceRegistry::get().watch(shared_from_this());
  return collectives_internal::Handles::device_request(work->state(), work);
}

bool DeviceComm::watch() {
  std::vector<std::shared_ptr<DeviceWork>> works;
  castmesh_te_comm_v1* comm = nullptr;
  bool failed = false;
  {
    MutexLock lock(mu_);
    works = pending_;
    comm = comm_;
    failed = !failure_.ok();
  }
  // running: not yet run on the device; left: running, or run while the
  // previous rank's descriptor is still on its way (kept until it is here).
  std::vector<std::shared_ptr<DeviceWork>> running;
  std::vector<std::shared_ptr<DeviceWork>> left;
  for (const std::shared_ptr<DeviceWork>& work : works) {
    const bool ran = work->poll();
    if (!ran) running.push_back(work);
    if (!ran || (!failed && !work->confirmed())) left.push_back(work);
  }
  {
    MutexLock lock(mu_);
    std::erase_if(pending_, [&](const std::shared_ptr<DeviceWork>& w) {
      return std::find(left.begin(), left.end(), w) == left.end() &&
             std::find(works.begin(), works.end(), w) != works.end();
    });
  }
  if (!failed && fail_mismatched(left)) return true;
  if (running.empty() || comm == nullptr) return !left.empty();
  castmesh_error_v1 error{};
  if (int32_t code = engine_->table->comm_async_error(comm, &error); code != CASTMESH_STATUS_OK) {
    // Work that ran meanwhile (the poll above is older than the error read)
    // is not failed by it: the error then surfaces on the next call's work,
    // whatever the timing, instead of aborting the communicator between calls.
    if (std::all_of(running.begin(), running.end(), [](const std::shared_ptr<DeviceWork>& w) { return w->poll(); })) {
      return !left.empty();
    }
    fail(absl::UnavailableError(absl::StrCat("the device communicator of ", name_,
                                             " failed (a peer died or the network failed): ", error.message,
                                             "; it was aborted")));
    return true;
  }
  const absl::Time now = absl::Now();
  for (const std::shared_ptr<DeviceWork>& work : running) {
    if (now < work->deadline()) continue;
    fail(absl::DeadlineExceededError(
        absl::StrCat(work->what(),
                     " did not complete within its DeviceOptions.timeout: a peer rank hung, died or called "
                     "another collective; the device communicator of ",
                     name_, " was aborted")));
    break;
  }
  return true;
}

bool DeviceComm::fail_mismatched(const std::vector<std::shared_ptr<DeviceWork>>& works) {
  for (const std::shared_ptr<DeviceWork>& work : works) {
    bool found_here = false;
    absl::Status why = work->conflict(&found_here);
    if (why.ok()) continue;
    // The other ranks learn it from the abort (their device calls fail here
    // too, their host calls in their mailboxes).
    if (found_here) {
      if (std::shared_ptr<CommGroup> group = work->call().group.lock()) group->abort(work->call().sequence, why);
    }
    // Also a peer that is gone (its descriptor never comes): then no hint.
    const bool mismatched = absl::StrContains(why.message(), "mismatched collective");
    fail(absl::Status(why.code(), absl::StrCat(why.message(), "; the device communicator of ", name_, " was aborted",
                                               mismatched ? " (call the same collective on every rank, with device "
                                                            "buffers on every rank or host buffers on every rank)"
                                                          : "")));
    return true;
  }
  return false;
}

void DeviceComm::fail(const absl::Status& why) {
  std::vector<std::shared_ptr<DeviceWork>> works;
  castmesh_te_comm_v1* comm = nullptr;
  {
    MutexLock lock(mu_);
    if (!failure_.ok()) return;
    failure_ = why;
    works = pending_;
    comm = comm_;
    comm_ = nullptr;
  }
  // Fail first, abort second: work the abort ends must not report success.
  for (const std::shared_ptr<DeviceWork>& work : works) {
    if (!work->poll()) work->fail(absl::Status(why.code(), absl::StrCat(work->what(), ": ", why.message())));
  }
  castmesh_error_v1 error{};
  if (comm != nullptr) engine_->table->comm_abort(comm, &error);
}

}  // namespace castmesh::detail
