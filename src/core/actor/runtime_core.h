// Internal: the state behind castmesh::Runtime and the cell of each actor.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/synchronization/mutex.h>

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "castmesh/detail/mutex.h"
#include "castmesh/detail/runtime_transport.h"
#include "castmesh/runtime.h"
#include "core/mailbox/mailbox.h"
#include "core/metrics/counters.h"
#include "core/scheduler/scheduler.h"
#include "core/scheduler/timer_queue.h"

namespace castmesh::detail {

class ActorCell;

// Someone to tell when an actor stops: a local actor (gets on_down) or a
// plain callback (Runtime::monitor).
struct Watcher {
  std::weak_ptr<ActorCell> cell;
  std::function<void(const DownEvent&)> callback;
  MonitorId id = 0;
};
void notify_down(const Watcher& w, const DownEvent& ev);

// The cell of one local actor: its mailbox, its object, and its links
// (parent, children, monitors). The actor object is touched only by the
// thread running the cell's turn; links are guarded by links_mu_.
// Lifetime: refs hold the cell (a small shell once stopped); the cell holds
// itself alive (self_) from start until it has stopped.
class ActorCell final : public Destination, public Schedulable, public std::enable_shared_from_this<ActorCell> {
 public:
  ActorCell(RuntimeCore* rt, Address address, std::unique_ptr<Actor> actor, const HandlerTable& table,
            std::shared_ptr<ActorCell> parent);
  ~ActorCell() override;

  // Destination
  void deliver(Envelope* env) override;
  uint32_t actor_class() const override { return table_.class_id; }
  RuntimeCore* runtime() const override { return rt_; }

  // A transport thread delivering a message from another proc (not from
  // inside any actor's turn): as deliver(), except that an actor of a class
  // with kShortHandlers that `env` finds idle handles it on this thread now
  // (one message; what queues meanwhile, and a stop or failure it causes,
  // go on on a worker).
  void deliver_here(Envelope* env);

  // Schedulable
  TurnResult run_turn(int batch) override;

  // Makes the actor runnable for the first time (on_start runs first).
  void start(DedicatedThread* thread);
  // Any thread: stop before the next message, dropping the rest.
  void request_stop_now(absl::Status reason);
  // Any thread: watch this actor (runs at once if it already stopped).
  void add_watcher(Watcher w);
  // Any thread: true if watcher `id` was still waiting and is now removed.
  bool remove_watcher(MonitorId id);
  // Any thread: link a child; false if this actor already stopped.
  bool add_child(std::shared_ptr<ActorCell> child);
  void remove_child(ActorCell* child);

  // Actor thread only (from Actor methods).
  void stop_after_current() { stop_requested_ = true; }
  void fail(absl::Status reason, std::string message_type, Address origin);
  void track_timer(TimerId id) { timers_.push_back(id); }
  void untrack_timer(TimerId id);
  // Pushes a runtime-made envelope; false (and deleted) if the actor stopped.
  bool mailbox_push_system(Envelope* env);
  Actor* actor() const { return actor_.get(); }
  std::string_view class_name() const { return table_.class_name; }

  // A ref to this cell: a copy of self_ while the actor runs (one atomic
  // increment; shared_from_this() is a CAS loop), else shared_from_this().
  // Actor thread only.
  std::shared_ptr<ActorCell> self_ref() { return self_ ? self_ : shared_from_this(); }

  // The cell whose turn runs on this thread, or nullptr.
  static ActorCell* current();
  // Its built-in metrics (core/metrics/counters.h). Any thread reads them.
  metrics::ActorCounters& counters() { return counters_; }

 private:
  void schedule();
  // Pushes `env`; the push that finds the actor idle runs it here
  // (`run_here`, run_one_here) or schedules it.
  void push_and_wake(Envelope* env, bool run_here);
  // The turn this thread owns (its push unblocked the mailbox), for one
  // message, on a thread that is no worker (deliver_here).
  void run_one_here();
  void dispatch(Envelope* env);
  void dispatch_user(Envelope* env);
  // Runs fn; an exception fails the actor ("<what> threw: ...").
  template <typename F>
  void run_guarded(const char* what, std::string_view message_type, F&& fn);
  void fail_from_exception(const char* what, std::string_view message_type);
  void finish();

  RuntimeCore* const rt_;
  Mailbox mailbox_;
  metrics::ActorCounters counters_;
  std::unique_ptr<Actor> actor_;
  const HandlerTable& table_;
  DedicatedThread* thread_ = nullptr;
  std::shared_ptr<ActorCell> self_;

  // Actor thread only.
  bool started_ = false;
  bool stop_requested_ = false;
  bool failed_ = false;
  absl::Status failure_;
  std::string failure_message_type_;
  Address failure_origin_;
  std::vector<TimerId> timers_;

  // Set by other threads (shutdown).
  std::atomic<bool> stop_now_{false};

  detail::Mutex links_mu_;
  bool stopped_ ABSL_GUARDED_BY(links_mu_) = false;
  absl::Status stop_now_reason_ ABSL_GUARDED_BY(links_mu_);
  std::shared_ptr<ActorCell> parent_ ABSL_GUARDED_BY(links_mu_);
  std::vector<std::shared_ptr<ActorCell>> children_ ABSL_GUARDED_BY(links_mu_);
  std::vector<Watcher> watchers_ ABSL_GUARDED_BY(links_mu_);
  absl::Status final_reason_ ABSL_GUARDED_BY(links_mu_);  // set once stopped_
};

// One request waiting for an answer from another proc (or a local reply
// port whose address was handed out).
struct PendingReply {
  ReplySink* sink = nullptr;  // holds one promise
  ProcId destination;         // empty: not tied to a proc
};

class RuntimeCore {
 public:
  RuntimeCore(Runtime* owner, RuntimeOptions options);
  ~RuntimeCore();

  Runtime* const owner;
  const RuntimeOptions options;

  const ProcId& proc_id() const { return proc_id_; }
  absl::Status set_proc_id(ProcId id);
  Scheduler& scheduler() { return *scheduler_; }
  bool shutting_down() const { return shutting_down_.load(std::memory_order_acquire); }

  absl::StatusOr<std::shared_ptr<Destination>> spawn(ActorCell* parent, std::unique_ptr<Actor> actor,
                                                  const HandlerTable& table, SpawnOptions options);
  // Local cell at `address` or nullptr.
  std::shared_ptr<ActorCell> find_local(const Address& address);
  // Every local actor that has not stopped (a snapshot; locks each
  // directory shard in turn). Any thread.
  std::vector<std::shared_ptr<ActorCell>> local_cells() { return live_cells(); }
  std::shared_ptr<Destination> resolve(const Address& address);
  void on_cell_stopped(ActorCell* cell);
  void report_unhandled(const SupervisionEvent& ev);
  void shutdown();

  // Remote seam.
  std::shared_ptr<RemoteRouter> router();
  void set_router(std::shared_ptr<RemoteRouter> r);
  // Registers `sink` (taking its promise) and returns its port id.
  uint64_t register_reply(ReplySink* sink, ProcId destination);
  // Removes a reply port; returns its sink (with its promise) or nullptr.
  ReplySink* take_reply(uint64_t port);
  Address reply_owner() const { return Address{proc_id_, "_reply", 0}; }
  void fail_pending_to_proc(const ProcId& proc, const absl::Status& error);
  // Remote monitors: the router is asked to watch an actor once, when its
  // first watcher arrives; every watcher of it is then told exactly once, by
  // report_remote_down or report_proc_down (whichever comes first).
  void watch_remote(const Address& actor, Watcher w);
  bool unwatch_remote(const Address& actor, MonitorId id);
  // Any thread: gives `w` an id and installs it on `target` (local cell,
  // remote watch, or told at once that there is no such actor).
  MonitorId monitor(const UntypedRef& target, Watcher w);
  bool demonitor(const UntypedRef& target, MonitorId id);
  void report_remote_down(const Address& actor, const absl::Status& reason, std::string message_type = {});
  void report_proc_down(const ProcId& proc, const absl::Status& reason);
  // `may_run_here`: the caller is a transport thread that may run a
  // short-handler actor's turn itself (ActorCell::deliver_here).
  absl::Status deliver_serialized(const Address& dst, std::string_view type_name, std::string_view bytes,
                                  const std::optional<PortAddress>& reply_to, const Address& sender,
                                  bool may_run_here = false);
  absl::Status deliver_serialized_reply(const PortAddress& port, std::string_view type_name, std::string_view bytes);
  void fail_reply_port(const PortAddress& port, absl::Status error);

  TimerQueue& timers() { return timers_; }
  size_t live_actors() const { return live_.load(std::memory_order_acquire); }

  // Thread-local runtime (worker, dedicated thread, running actor) or the
  // process default.
  static RuntimeCore* current();

 private:
  void on_thread_start();
  // Tells remote watchers on the timer thread: reports come from the
  // transport's I/O thread, which must not run monitor callbacks.
  struct RemoteDown {
    DownEvent event;
    std::vector<Watcher> watchers;
  };
  void notify_remote_down(std::vector<RemoteDown> downs);

  ProcId proc_id_;
  std::atomic<bool> spawned_any_{false};
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> shut_down_{false};
  std::unique_ptr<Scheduler> scheduler_;
  TimerQueue timers_;

  // Local actors by (name, index), sharded by index so spawns and stops on
  // different threads rarely share a lock.
  struct DirectoryShard {
    detail::Mutex mu;
    absl::flat_hash_map<std::pair<std::string, uint64_t>, std::weak_ptr<ActorCell>> cells ABSL_GUARDED_BY(mu);
  };
  static constexpr size_t kDirectoryShards = 32;
  DirectoryShard& shard(uint64_t index) { return directory_[index % kDirectoryShards]; }
  std::vector<std::shared_ptr<ActorCell>> live_cells();

  std::atomic<uint64_t> next_index_{0};
  std::array<DirectoryShard, kDirectoryShards> directory_;

  std::atomic<size_t> live_{0};
  detail::Mutex live_mu_;
  detail::CondVar live_cv_;

  detail::Mutex threads_mu_;
  std::vector<std::unique_ptr<DedicatedThread>> dedicated_ ABSL_GUARDED_BY(threads_mu_);

  detail::Mutex router_mu_;
  std::shared_ptr<RemoteRouter> router_ ABSL_GUARDED_BY(router_mu_);

  detail::Mutex ports_mu_;
  uint64_t next_port_ ABSL_GUARDED_BY(ports_mu_) = 1;
  absl::flat_hash_map<uint64_t, PendingReply> ports_ ABSL_GUARDED_BY(ports_mu_);

  std::atomic<MonitorId> next_monitor_{1};
  detail::Mutex watch_mu_;
  absl::flat_hash_map<Address, std::vector<Watcher>> remote_watchers_ ABSL_GUARDED_BY(watch_mu_);
};

// An actor of another proc; sends are encoded and routed.
class RemoteDestination final : public Destination {
 public:
  RemoteDestination(RuntimeCore* rt, Address address) : Destination(std::move(address)), rt_(rt) {}
  void deliver(Envelope* env) override;
  RuntimeCore* runtime() const override { return rt_; }

 private:
  RuntimeCore* const rt_;
};

// Wire name of a stop request (UntypedRef::stop on a remote actor).
inline constexpr std::string_view kStopWireName = "castmesh.Stop";

// "actor proc/name[i] stopped: reason" (kUnavailable).
absl::Status actor_stopped_error(const Address& a, const absl::Status& reason);

}  // namespace castmesh::detail
