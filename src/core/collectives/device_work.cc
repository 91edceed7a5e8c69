// DeviceEventPool and DeviceWork (device_work.h), and the hand-over of a
// pooled actor's worker around blocking device calls.
#include "core/collectives/device_work.h"

#include <utility>

#include "core/collectives/comm_group.h"
#include "core/progress/request_state.h"
#include "core/scheduler/scheduler.h"

namespace castmesh::detail {

// DeviceStream::synchronize and DeviceEvent::synchronize block in the
// backend until device work is done; in a pooled actor they hand the worker
// on, as DeviceWork::wait does: the work may be a collective that waits for
// members queued behind this one. (The tensor layer, which makes those
// calls, sees nothing of the scheduler.)
absl::Status run_handing_worker_on(absl::FunctionRef<absl::Status()> call) {
  const Scheduler::BlockingScope blocking;
  return call();
}

namespace {
[[maybe_unused]] const bool kDeviceWaitsHandWorkersOn = (set_blocking_call_wrapper(&run_handing_worker_on), true);
}  // namespace

// ---- DeviceEventPool ----

DeviceEventPool::~DeviceEventPool() {
  castmesh_error_v1 ignored{};
  MutexLock lock(mu_);
  for (castmesh_te_event_v1* event : idle_) engine_->table->event_destroy(event, &ignored);
}

absl::StatusOr<castmesh_te_event_v1*> DeviceEventPool::take() {
  {
    MutexLock lock(mu_);
    if (!idle_.empty()) {
      castmesh_te_event_v1* event = idle_.back();
      idle_.pop_back();
      return event;
    }
  }
  castmesh_te_event_v1* event = nullptr;
  castmesh_error_v1 error{};
  if (int32_t code = engine_->table->event_create(device_.index, &event, &error); code != CASTMESH_STATUS_OK) {
    return backend_status(code, error, "event_create");
  }
  return event;
}

void DeviceEventPool::give_back(castmesh_te_event_v1* event) {
  {
    MutexLock lock(mu_);
    if (idle_.size() < kMaxIdle) {
      idle_.push_back(event);
      return;
    }
  }
  castmesh_error_v1 ignored{};
  engine_->table->event_destroy(event, &ignored);
}

// ---- DeviceWork ----

DeviceWork::DeviceWork(const DeviceEngine* engine, Device device, std::string what, absl::Time deadline,
                       std::shared_ptr<DeviceEventPool> events, castmesh_te_event_v1* event,
                       std::vector<TensorView> keep, DeviceStream stream, DeviceCall call)
    : engine_(engine),
      device_(device),
      what_(std::move(what)),
      deadline_(deadline),
      events_(std::move(events)),
      event_(event),
      call_(std::move(call)),
      state_(std::make_shared<RequestState>()),
      keep_(std::move(keep)),
      stream_(std::move(stream)) {}

// A stream that waited on the event (wait_stream) captured it then; a later
// record of the reused event does not change what that stream waits for.
DeviceWork::~DeviceWork() { events_->give_back(event_); }

bool DeviceWork::poll() {
  {
    MutexLock lock(mu_);
    if (ran_) return true;
  }
  int32_t done = 0;
  castmesh_error_v1 error{};
  const int32_t code = engine_->table->event_query(event_, &done, &error);
  if (code != CASTMESH_STATUS_OK) {
    state_->complete(backend_status(code, error, absl::StrCat(what_, ": event_query")));
    return false;  // keep the buffers: the device may still use them
  }
  if (done == 0) return false;
  std::vector<TensorView> released;
  DeviceStream stream;
  {
    MutexLock lock(mu_);
    ran_ = true;
    released.swap(keep_);
    stream = std::move(stream_);
  }
  state_->complete(MessageStatus{});
  return true;
}

absl::StatusOr<MessageStatus> DeviceWork::wait(absl::Duration timeout) {
  const absl::Time give_up = timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  // Spin (yielding) for the first 200 us: small collectives finish in
  // microseconds and a sleep would dominate them. Then naps of up to a
  // millisecond; the watchdog fails the request on an error or a deadline.
  const absl::Time spin_until = absl::Now() + absl::Microseconds(200);
  absl::Duration nap = absl::Microseconds(20);
  // Made before the first nap: a pooled actor that waits longer than the
  // spin hands its queued work on (the ranks that must still enqueue their
  // part of this collective may be queued behind it).
  std::optional<Scheduler::BlockingScope> blocking;
  while (true) {
    if (std::optional<absl::StatusOr<MessageStatus>> result = state_->test()) return *result;
    poll();
    if (std::optional<absl::StatusOr<MessageStatus>> result = state_->test()) return *result;
    const absl::Time now = absl::Now();
    if (now >= give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat(what_, " did not complete within ", absl::FormatDuration(timeout), " (still pending)"));
    }
    if (now < spin_until) {
      std::this_thread::yield();
      continue;
    }
    if (!blocking.has_value()) blocking.emplace();
    absl::SleepFor(nap);
    nap = std::min(nap * 2, absl::Milliseconds(1));
  }
}

absl::Status DeviceWork::order_before(const DeviceStream& stream) {
  if (!stream.valid()) return absl::InvalidArgumentError("wait_stream on no stream (a default-made DeviceStream)");
  if (stream.device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat("wait_stream: ", what_, " ran on ", device_.to_string(),
                                                   " but the stream is on ", stream.device().to_string()));
  }
  if (std::optional<absl::StatusOr<MessageStatus>> result = state_->test(); result && !result->ok()) {
    return result->status();
  }
  castmesh_error_v1 error{};
  return backend_status(engine_->table->stream_wait_event(stream.handle(), event_, &error), error, "stream_wait_event");
}

void DeviceWork::fail(const absl::Status& why) { state_->complete(why); }

bool DeviceWork::confirmed() const { return call_.descriptor == nullptr || call_.descriptor->done(); }

absl::Status DeviceWork::conflict(bool* found_here) const {
  *found_here = false;
  if (call_.descriptor != nullptr && call_.descriptor->done()) {
    absl::StatusOr<MessageStatus> got = *call_.descriptor->test();
    if (!got.ok()) {
      std::shared_ptr<CommGroup> group = call_.group.lock();
      // Aborted by another rank (its error is recorded): nothing to tell.
      *found_here = group == nullptr || group->mailbox().collective_error(call_.sequence).ok();
      return got.status();
    }
  }
  std::shared_ptr<CommGroup> group = call_.group.lock();
  return group == nullptr ? absl::OkStatus() : group->mailbox().collective_error(call_.sequence);
}

}  // namespace castmesh::detail
