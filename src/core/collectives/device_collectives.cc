// Device collectives (device_collectives.h): argument checks, the lazily
// made device communicator of each group, the enqueue + event of each call,
// and the watchdog.
#include "core/collectives/device_collectives.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/collectives/algorithms.h"
#include "core/collectives/comm_group.h"
#include "core/progress/request_state.h"
#include "core/scheduler/scheduler.h"
#include "core/progress/progress_engine.h"

namespace castmesh {
namespace detail {

// ---- Device waits in pooled actors ----

namespace {
// DeviceStream::synchronize and DeviceEvent::synchronize block in the
// backend until device work is done; in a pooled actor they hand the worker
// on, as DeviceWork::wait does: the work may be a collective that waits for
// members queued behind this one. (The tensor layer, which makes those
// calls, sees nothing of the scheduler.)
absl::Status run_handing_worker_on(absl::FunctionRef<absl::Status()> call) {
  const Scheduler::BlockingScope blocking;
  return call();
}
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

namespace {

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
class DeviceRegistry {
 public:
  static DeviceRegistry& get() {
    static DeviceRegistry& registry = *new DeviceRegistry();  // never destroyed: its thread runs until exit
    return registry;
  }

  // The group's slot, made on first use (slots of dead groups are dropped).
  struct Slot {
    Mutex mu;
    std::shared_ptr<DeviceComm> comm ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<Slot> slot(CommGroup& group) {
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

  // Has the watchdog poll `comm` until its work is done.
  void watch(const std::shared_ptr<DeviceComm>& comm) {
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

 private:
  struct Entry {
    std::weak_ptr<CommGroup> group;
    std::shared_ptr<Slot> slot;
  };

  void run() {
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
Request given_up(const DeviceCall& call, absl::Status why) {
  if (std::shared_ptr<CommGroup> group = call.group.lock()) group->abort(call.sequence, why);
  return Request(RequestState::Done(std::move(why)));
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
  return Request(work->state(), work);
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

// ---- the device communicator's creation ----

// What every rank tells the others when the device communicator is made.
struct InitRecord {
  int32_t kind = -1;  // DeviceKind of this rank's buffers, -1 when its checks failed
  int32_t index = 0;
  int32_t status = CASTMESH_STATUS_OK;  // rank 0: making the id; others: OK
  int32_t checked = 1;                  // 0: this rank's arguments were refused
  castmesh_te_unique_id_v1 id{};
  char message[256] = {};
};

void set_message(InitRecord& record, absl::string_view text) {
  const size_t n = std::min(text.size(), sizeof(record.message) - 1);
  std::memcpy(record.message, text.data(), n);
  record.message[n] = '\0';
}

// Two ranks of one process on one device: NCCL/RCCL refuse that at
// comm_create on some ranks only ("duplicate GPU"), which would leave the
// others waiting there; every rank sees the same records and refuses here.
absl::Status check_devices(const CommGroup& group, const std::vector<InitRecord>& all) {
  const std::vector<ProcId>& procs = group.layout().procs;
  for (size_t a = 0; a < all.size(); ++a) {
    for (size_t b = a + 1; b < all.size(); ++b) {
      if (procs[a] != procs[b] || all[a].kind != all[b].kind || all[a].index != all[b].index) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "ranks ", a, " and ", b, " of communicator ", group.id(), " run in the same process on ",
          Device{static_cast<DeviceKind>(all[a].kind), all[a].index}.to_string(),
          ": NCCL/RCCL need one device per rank; give each rank its own device"));
    }
  }
  return absl::OkStatus();
}

// Every rank's InitRecord, through a host allgather that cannot hang: it runs
// on a thread of its own and is given up after `timeout`. It is the host part
// of device collective `call` (its number and its signature: a rank that
// called something else meets it as a mismatched collective). Ranks that passed
// host buffers to this collective run a host algorithm with the same number
// instead; some of them may never send what this rank waits for. On a failure
// or the timeout the collective is aborted on every rank, which also ends the
// host algorithm's receives on the ranks that wait for this one.
absl::StatusOr<std::vector<InitRecord>> exchange_records(CommGroup& group, const InitRecord& mine,
                                                         absl::Duration timeout, uint64_t sequence,
                                                         const std::string& signature) {
  struct Exchanged {
    InitRecord mine;
    std::vector<InitRecord> all;
  };
  auto buffers = std::make_shared<Exchanged>(Exchanged{mine, std::vector<InitRecord>(group.size())});
  const collectives::CollectiveCall call{&group, sequence, std::make_shared<const std::string>(signature)};
  Request request = group.run_async([call, buffers] {
    return collectives::run_allgather(call, &buffers->mine, buffers->all.data(), sizeof(InitRecord));
  });
  absl::StatusOr<MessageStatus> done = request.wait(timeout);
  absl::Status st = done.status();
  if (absl::IsDeadlineExceeded(st)) {
    st = absl::DeadlineExceededError(absl::StrCat(
        "the first device collective of communicator ", group.id(), " did not meet every rank within ",
        absl::FormatDuration(timeout),
        " (DeviceOptions.timeout): a rank passed host buffers, called another collective, or hung"));
  } else if (absl::IsFailedPrecondition(st) && absl::StrContains(st.message(), "mismatched collective")) {
    st = absl::InvalidArgumentError(absl::StrCat("the first device collective of communicator ", group.id(),
                                                 " met a rank that called something else: ",
                                                 st.message()));
  }
  if (!st.ok()) {
    group.abort(call.sequence, st);
    // The exchange's receives end with the abort; wait for its thread so no
    // late byte lands after this returns (it owns its buffers regardless).
    (void)request.wait(absl::InfiniteDuration());
    return st;
  }
  return std::move(buffers->all);
}

// Whether this process's collective library (NCCL/RCCL) loads: an empty
// group, which makes the backend load it and enqueues nothing.
int32_t probe_collectives(const castmesh_tensor_engine_table_v1& table, castmesh_error_v1* error) {
  const int32_t code = table.group_begin(error);
  if (code != CASTMESH_STATUS_OK) return code;
  return table.group_end(error);
}

absl::StatusOr<std::shared_ptr<DeviceComm>> make_comm(CommGroup& group, const DeviceEngine* engine, Device device,
                                                      const absl::Status& checked, absl::Duration timeout,
                                                      uint64_t sequence, const std::string& what) {
  const castmesh_tensor_engine_table_v1& table = *engine->table;
  InitRecord mine;
  if (checked.ok()) {
    mine.kind = static_cast<int32_t>(device.kind);
    mine.index = device.index;
  } else {
    mine.checked = 0;
    set_message(mine, checked.message());
  }
  castmesh_error_v1 error{};
  // Everything that can fail on one rank alone happens before the exchange,
  // and its outcome travels in it: once a rank is inside comm_create it
  // waits there for every other rank. Rank 0 makes the id; the others check
  // that their collective library loads (an empty group: making an id would
  // start an NCCL bootstrap root that nobody joins).
  absl::StatusOr<DeviceStream> own = absl::FailedPreconditionError("not made");
  if (checked.ok()) {
    mine.status = group.rank() == 0 ? table.comm_unique_id(&mine.id, &error) : probe_collectives(table, &error);
    if (mine.status != CASTMESH_STATUS_OK) set_message(mine, error.message);
  }
  if (checked.ok() && mine.status == CASTMESH_STATUS_OK) {
    own = DeviceStream::Create(device);
    if (!own.ok()) {
      mine.status = CASTMESH_STATUS_INTERNAL;
      set_message(mine, own.status().message());
    }
  }
  absl::StatusOr<std::vector<InitRecord>> exchanged = exchange_records(group, mine, timeout, sequence, what);
  if (!exchanged.ok()) return exchanged.status();
  const std::vector<InitRecord>& all = *exchanged;
  // Every rank saw the same records, so every rank takes the same decision.
  if (!checked.ok()) return checked;  // this rank's own reason
  for (int r = 0; r < group.size(); ++r) {
    if (all[r].checked == 0) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r, " refused its arguments: ", all[r].message));
    }
  }
  for (int r = 0; r < group.size(); ++r) {
    if (all[r].status == CASTMESH_STATUS_OK) continue;
    return backend_status(all[r].status, castmesh_error_v1{all[r].status, {}},
                          absl::StrCat("rank ", r, " cannot join the device communicator: ", all[r].message));
  }
  if (absl::Status st = check_devices(group, all); !st.ok()) return st;
  for (int r = 1; r < group.size(); ++r) {
    if (all[r].kind != all[0].kind) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ranks hold their buffers on different kinds of device: rank 0 on ",
          Device{static_cast<DeviceKind>(all[0].kind), all[0].index}.to_string(), ", rank ", r, " on ",
          Device{static_cast<DeviceKind>(all[r].kind), all[r].index}.to_string(), "; use one kind on every rank"));
    }
  }
  const std::string name = absl::StrCat("communicator ", group.id(), " (rank ", group.rank(), ")");
  castmesh_te_comm_v1* comm = nullptr;
  // The library's init is collective (it returns once every rank joined).
  const absl::Status created = run_handing_worker_on([&] {
    return backend_status(table.comm_create(device.index, &all[0].id, group.size(), group.rank(), &comm, &error),
                          error, absl::StrCat("comm_create for ", name));
  });
  if (!created.ok()) return created;
  return std::make_shared<DeviceComm>(engine, device, name, comm, *std::move(own));
}

// The group's device communicator on `device`, made at the first call
// (collective: every rank calls it at the same point; `checked` is this
// rank's argument check, shared so a refused call fails on every rank).
absl::StatusOr<std::shared_ptr<DeviceComm>> comm_for(CommGroup& group, const DeviceEngine* engine, Device device,
                                                     const absl::Status& checked, absl::Duration timeout,
                                                     const DeviceCall& call, const std::string& what) {
  std::shared_ptr<DeviceRegistry::Slot> slot = DeviceRegistry::get().slot(group);
  MutexLock lock(slot->mu);
  if (slot->comm != nullptr) {
    if (!checked.ok()) return checked;
    if (slot->comm->device() != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "this rank's device collectives of communicator ", group.id(), " run on ", slot->comm->device().to_string(),
          " but the buffers are on ", device.to_string(),
          ": a communicator uses one device per rank (stage through the host, or use another communicator)"));
    }
    return slot->comm;
  }
  absl::StatusOr<std::shared_ptr<DeviceComm>> made = make_comm(group, engine, device, checked, timeout, call.sequence, what);
  if (!made.ok()) return made.status();
  slot->comm = *made;
  return slot->comm;
}

}  // namespace
}  // namespace detail

namespace collectives {
namespace {

using detail::DeviceComm;
using detail::DeviceEngine;
using detail::RequestState;

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

constexpr absl::string_view kStageHint =
    "copy the buffers to the host (castmesh::device_copy / .cpu()) and call the same collective there";

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

// Takes the collective's number and announces it: posts the receive of the
// previous rank's descriptor and sends this rank's to the next rank (empty
// messages whose signature is `what`; neither is waited for here), so a rank
// that called something else at that number finds out without a round trip.
detail::DeviceCall announce(detail::CommGroup& group, const std::string& what) {
  detail::DeviceCall call{group.weak_from_this(), group.next_sequence(), nullptr};
  const int n = group.size();
  if (n == 1) return call;
  static const char kNoBody = 0;
  const int64_t tag = collective_tag(call.sequence, kDescriptorStep);
  call.descriptor = group.post_recv(Channel::kCollective, (group.rank() + n - 1) % n, tag, nullptr, 0,
                                    std::make_shared<const std::string>(what));
  (void)group.start_send(Channel::kCollective, (group.rank() + 1) % n, tag, &kNoBody, 0, what, call.sequence);
  return call;
}

// One device collective: its number and descriptors, the engine, this rank's
// check, the communicator (made at the first call with every rank's check),
// then the enqueue. A failure here fails the collective on every rank.
Request run(detail::CommGroup& group, std::string what, const Device& device, absl::Status checked,
            std::vector<TensorView> keep, const DeviceOptions& options, const DeviceComm::Enqueue& enqueue) {
  detail::DeviceCall call = announce(group, what);
  absl::StatusOr<const DeviceEngine*> engine = detail::device_engine_for(device, what);
  if (!engine.ok()) return detail::given_up(call, engine.status());
  if (checked.ok() && options.timeout <= absl::ZeroDuration()) {
    checked = absl::InvalidArgumentError("DeviceOptions.timeout must be positive");
  }
  const absl::Duration timeout = options.timeout > absl::ZeroDuration() ? options.timeout : absl::Seconds(1);
  absl::StatusOr<std::shared_ptr<DeviceComm>> comm =
      detail::comm_for(group, *engine, device, checked, timeout, call, what);
  if (!comm.ok()) {
    return detail::given_up(call,
                            absl::Status(comm.status().code(), absl::StrCat(what, ": ", comm.status().message())));
  }
  return (*comm)->launch(std::move(what), std::move(keep), options, enqueue, std::move(call));
}

std::string describe(absl::string_view name, absl::string_view op, const TensorView& t, int root = -1) {
  std::string s = absl::StrCat("device ", name, "(");
  if (!op.empty()) absl::StrAppend(&s, op, ", ");
  absl::StrAppend(&s, std::string(dtype_name(t.dtype())), ", count=", t.numel());
  if (root >= 0) absl::StrAppend(&s, ", root=", root);
  return s + ")";
}

char* at(const TensorView& t, size_t offset) { return static_cast<char*>(t.data()) + offset; }

// Runs the calls of `body` as one backend group (group_end always called).
int32_t grouped(const castmesh_tensor_engine_table_v1& table, castmesh_error_v1* error,
                const std::function<int32_t()>& body) {
  int32_t code = table.group_begin(error);
  if (code != CASTMESH_STATUS_OK) return code;
  code = body();
  castmesh_error_v1 end_error{};
  const int32_t end = table.group_end(&end_error);
  if (code == CASTMESH_STATUS_OK && end != CASTMESH_STATUS_OK) {
    *error = end_error;
    code = end;
  }
  return code;
}

const castmesh_tensor_engine_table_v1* table_for(const Device& device) {
  absl::StatusOr<const DeviceEngine*> engine = detail::device_engine_for(device, "device collective");
  return engine.ok() ? (*engine)->table : nullptr;
}

}  // namespace

bool on_device(const TensorView& a, const TensorView& b) {
  return detail::is_engine_device(a.device()) || detail::is_engine_device(b.device());
}

absl::Status host_only(const TensorView& t, absl::string_view what, absl::string_view op) {
  return absl::UnimplementedError(
      absl::StrCat(what, " lives on ", t.device().to_string(), ": ", op,
                   " runs on host memory only (NCCL/RCCL have no tags, any-source or probe); ", kStageHint));
}

Request device_allreduce(detail::CommGroup& group, const TensorView& in, const TensorView& out, const ReduceSpec& op,
                         const DeviceOptions& options) {
  const Device device = in.device();
  absl::Status checked = check_device_buffer(in, "input", device, false);
  if (checked.ok()) checked = check_device_buffer(out, "output", device, true);
  if (checked.ok() && in.dtype() != out.dtype()) checked = absl::InvalidArgumentError("input and output dtypes differ");
  if (checked.ok()) checked = check_count(out, "output", static_cast<size_t>(in.numel()));
  absl::StatusOr<std::pair<int32_t, int32_t>> red = reduction_of(in.dtype(), op);
  if (checked.ok() && !red.ok()) checked = red.status();
  const auto [dtype, reduce] = red.ok() ? *red : std::make_pair(0, 0);
  const uint64_t n = static_cast<uint64_t>(in.numel());
  return run(
      group, describe("allreduce", op.name(), in), device, checked, {in, out}, options,
      [&, dtype = dtype, reduce = reduce](castmesh_te_comm_v1* c, castmesh_te_stream_v1* s, castmesh_error_v1* e) {
        return table_for(device)->allreduce(c, in.data(), out.data(), n, dtype, reduce, s, e);
      });
}

Request device_reduce(detail::CommGroup& group, const TensorView& in, const TensorView& out, const ReduceSpec& op,
                      int root, const DeviceOptions& options) {
  // The ABI has no reduce: every rank allreduces, non-roots into scratch.
  const Device device = in.device();
  absl::Status checked = check_device_buffer(in, "input", device, false);
  if (checked.ok()) checked = check_root(root, group.size());
  if (checked.ok() && group.rank() == root) {
    checked = check_device_buffer(out, "output", device, true);
    if (checked.ok() && in.dtype() != out.dtype())
      checked = absl::InvalidArgumentError("input and output dtypes differ");
    if (checked.ok()) checked = check_count(out, "output", static_cast<size_t>(in.numel()));
  }
  absl::StatusOr<std::pair<int32_t, int32_t>> red = reduction_of(in.dtype(), op);
  if (checked.ok() && !red.ok()) checked = red.status();
  TensorView target = out;
  if (checked.ok() && group.rank() != root) {
    absl::StatusOr<TensorView> scratch = device_empty(in.dtype(), {in.numel()}, device);
    if (scratch.ok())
      target = *scratch;
    else
      checked = scratch.status();
  }
  const auto [dtype, reduce] = red.ok() ? *red : std::make_pair(0, 0);
  const uint64_t n = static_cast<uint64_t>(in.numel());
  return run(
      group, describe("reduce", op.name(), in, root), device, checked, {in, target}, options,
      [&, dtype = dtype, reduce = reduce](castmesh_te_comm_v1* c, castmesh_te_stream_v1* s, castmesh_error_v1* e) {
        return table_for(device)->allreduce(c, in.data(), target.data(), n, dtype, reduce, s, e);
      });
}

Request device_broadcast(detail::CommGroup& group, const TensorView& data, int root, const DeviceOptions& options) {
  const Device device = data.device();
  absl::Status checked = check_device_buffer(data, "buffer", device, group.rank() != root);
  if (checked.ok()) checked = check_root(root, group.size());
  return run(group, describe("broadcast", "", data, root), device, checked, {data}, options,
             [&](castmesh_te_comm_v1* c, castmesh_te_stream_v1* s, castmesh_error_v1* e) {
               return table_for(device)->broadcast(c, data.data(), data.data(), data.nbytes(), CASTMESH_TE_DTYPE_UINT8,
                                                   root, s, e);
             });
}

Request device_allgather(detail::CommGroup& group, const TensorView& in, const TensorView& out,
                         const DeviceOptions& options) {
  const Device device = in.device();
  absl::Status checked = check_device_buffer(in, "input", device, false);
  if (checked.ok()) checked = check_device_buffer(out, "output", device, true);
  if (checked.ok() && in.dtype() != out.dtype()) checked = absl::InvalidArgumentError("input and output dtypes differ");
  if (checked.ok()) checked = check_count(out, "output", static_cast<size_t>(in.numel()) * group.size());
  return run(group, describe("allgather", "", in), device, checked, {in, out}, options,
             [&](castmesh_te_comm_v1* c, castmesh_te_stream_v1* s, castmesh_error_v1* e) {
               return table_for(device)->allgather(c, in.data(), out.data(), in.nbytes(), CASTMESH_TE_DTYPE_UINT8, s,
                                                   e);
             });
}

Request device_reduce_scatter(detail::CommGroup& group, const TensorView& in, const TensorView& out,
                              const ReduceSpec& op, const DeviceOptions& options) {
  const Device device = in.device();
  absl::Status checked = check_device_buffer(in, "input", device, false);
  if (checked.ok()) checked = check_device_buffer(out, "output", device, true);
  if (checked.ok() && in.dtype() != out.dtype()) checked = absl::InvalidArgumentError("input and output dtypes differ");
  if (checked.ok()) checked = check_count(in, "input", static_cast<size_t>(out.numel()) * group.size());
  absl::StatusOr<std::pair<int32_t, int32_t>> red = reduction_of(in.dtype(), op);
  if (checked.ok() && !red.ok()) checked = red.status();
  const auto [dtype, reduce] = red.ok() ? *red : std::make_pair(0, 0);
  const uint64_t n = static_cast<uint64_t>(out.numel());
  return run(
      group, describe("reduce_scatter", op.name(), out), device, checked, {in, out}, options,
      [&, dtype = dtype, reduce = reduce](castmesh_te_comm_v1* c, castmesh_te_stream_v1* s, castmesh_error_v1* e) {
        return table_for(device)->reduce_scatter(c, in.data(), out.data(), n, dtype, reduce, s, e);
      });
}

Request device_gather(detail::CommGroup& group, const TensorView& in, const TensorView& out, int root,
                      const DeviceOptions& options) {
  const Device device = in.device();
  const int rank = group.rank();
  const int size = group.size();
  absl::Status checked = check_device_buffer(in, "input", device, false);
  if (checked.ok()) checked = check_root(root, size);
  if (checked.ok() && rank == root) {
    checked = check_device_buffer(out, "output", device, true);
    if (checked.ok() && in.dtype() != out.dtype())
      checked = absl::InvalidArgumentError("input and output dtypes differ");
    if (checked.ok()) checked = check_count(out, "output", static_cast<size_t>(in.numel()) * size);
  }
  const size_t bytes = in.nbytes();
  return run(group, describe("gather", "", in, root), device, checked, {in, out}, options,
             [&](castmesh_te_comm_v1* c, castmesh_te_stream_v1* s, castmesh_error_v1* e) {
               const castmesh_tensor_engine_table_v1& t = *table_for(device);
               return grouped(t, e, [&]() -> int32_t {
                 if (rank != root) return t.send(c, in.data(), bytes, CASTMESH_TE_DTYPE_UINT8, root, s, e);
                 for (int r = 0; r < size; ++r) {
                   int32_t code = r == rank ? (at(out, bytes * r) == in.data() || bytes == 0
                                                   ? int32_t{CASTMESH_STATUS_OK}
                                                   : t.copy(at(out, bytes * r), in.data(), bytes,
                                                            CASTMESH_TE_COPY_DEVICE_TO_DEVICE, s, e))
                                            : t.recv(c, at(out, bytes * r), bytes, CASTMESH_TE_DTYPE_UINT8, r, s, e);
                   if (code != CASTMESH_STATUS_OK) return code;
                 }
                 return CASTMESH_STATUS_OK;
               });
             });
}

Request device_scatter(detail::CommGroup& group, const TensorView& in, const TensorView& out, int root,
                       const DeviceOptions& options) {
  const Device device = out.device();
  const int rank = group.rank();
  const int size = group.size();
  absl::Status checked = check_device_buffer(out, "output", device, true);
  if (checked.ok()) checked = check_root(root, size);
  if (checked.ok() && rank == root) {
    checked = check_device_buffer(in, "input", device, false);
    if (checked.ok() && in.dtype() != out.dtype())
      checked = absl::InvalidArgumentError("input and output dtypes differ");
    if (checked.ok()) checked = check_count(in, "input", static_cast<size_t>(out.numel()) * size);
  }
  const size_t bytes = out.nbytes();
  return run(group, describe("scatter", "", out, root), device, checked, {in, out}, options,
             [&](castmesh_te_comm_v1* c, castmesh_te_stream_v1* s, castmesh_error_v1* e) {
               const castmesh_tensor_engine_table_v1& t = *table_for(device);
               return grouped(t, e, [&]() -> int32_t {
                 if (rank != root) return t.recv(c, out.data(), bytes, CASTMESH_TE_DTYPE_UINT8, root, s, e);
                 for (int r = 0; r < size; ++r) {
                   int32_t code = r == rank ? (at(in, bytes * r) == out.data() || bytes == 0
                                                   ? int32_t{CASTMESH_STATUS_OK}
                                                   : t.copy(out.data(), at(in, bytes * r), bytes,
                                                            CASTMESH_TE_COPY_DEVICE_TO_DEVICE, s, e))
                                            : t.send(c, at(in, bytes * r), bytes, CASTMESH_TE_DTYPE_UINT8, r, s, e);
                   if (code != CASTMESH_STATUS_OK) return code;
                 }
                 return CASTMESH_STATUS_OK;
               });
             });
}

Request device_alltoall(detail::CommGroup& group, const TensorView& in, const TensorView& out,
                        const DeviceOptions& options) {
  const Device device = in.device();
  const int rank = group.rank();
  const int size = group.size();
  absl::Status checked = check_device_buffer(in, "input", device, false);
  if (checked.ok()) checked = check_device_buffer(out, "output", device, true);
  if (checked.ok() && in.dtype() != out.dtype()) checked = absl::InvalidArgumentError("input and output dtypes differ");
  if (checked.ok()) checked = check_count(out, "output", static_cast<size_t>(in.numel()));
  if (checked.ok() && in.numel() % size != 0) {
    checked = absl::InvalidArgumentError(
        absl::StrCat("alltoall input of ", in.numel(), " elements is not divisible into ", size, " blocks"));
  }
  // In place: the blocks are sent from a copy, made first on the stream.
  TensorView source = in;
  if (checked.ok() && in.data() == out.data() && in.numel() > 0) {
    absl::StatusOr<TensorView> scratch = device_empty(in.dtype(), {in.numel()}, device);
    if (scratch.ok())
      source = *scratch;
    else
      checked = scratch.status();
  }
  const size_t block = checked.ok() ? in.nbytes() / size : 0;
  return run(group, describe("alltoall", "", in), device, checked, {in, out, source}, options,
             [&](castmesh_te_comm_v1* c, castmesh_te_stream_v1* s, castmesh_error_v1* e) {
               const castmesh_tensor_engine_table_v1& t = *table_for(device);
               if (source.data() != in.data()) {
                 int32_t code = t.copy(source.data(), in.data(), in.nbytes(), CASTMESH_TE_COPY_DEVICE_TO_DEVICE, s, e);
                 if (code != CASTMESH_STATUS_OK) return code;
               }
               if (block == 0) return int32_t{CASTMESH_STATUS_OK};
               return grouped(t, e, [&]() -> int32_t {
                 for (int r = 0; r < size; ++r) {
                   int32_t code = CASTMESH_STATUS_OK;
                   if (r == rank) {
                     code = t.copy(at(out, block * r), at(source, block * r), block, CASTMESH_TE_COPY_DEVICE_TO_DEVICE,
                                   s, e);
                   } else {
                     code = t.send(c, at(source, block * r), block, CASTMESH_TE_DTYPE_UINT8, r, s, e);
                     if (code == CASTMESH_STATUS_OK) {
                       code = t.recv(c, at(out, block * r), block, CASTMESH_TE_DTYPE_UINT8, r, s, e);
                     }
                   }
                   if (code != CASTMESH_STATUS_OK) return code;
                 }
                 return CASTMESH_STATUS_OK;
               });
             });
}

}  // namespace collectives

// ---- Request's device half ----

absl::Status Request::wait_stream(const DeviceStream& stream) const {
  if (device_ != nullptr) return device_->order_before(stream);
  absl::StatusOr<MessageStatus> result = state_->wait(absl::InfiniteDuration());
  return result.status();
}

}  // namespace castmesh
