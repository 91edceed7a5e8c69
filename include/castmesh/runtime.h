// Runtime: hosts actors in one process (a proc): the scheduler's worker pool,
// timers, the directory of local actors, and the seam to other procs.
//
// Create one per process (tests may create several), spawn actors, and
// destroy it (or call shutdown()) from a plain thread: every actor stops
// (on_stop runs, queued requests fail), then every thread is joined.
// Refs must not be used after their runtime is destroyed.
//
// Cross-process seam: set_proc_id() names this proc (default "local")
// before the first spawn; the transport reaches the runtime through the
// internal castmesh/detail/runtime_transport.h (not user API; docs/actors.md).
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/time/time.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "castmesh/address.h"
#include "castmesh/detail/handlers.h"
#include "castmesh/future.h"
#include "castmesh/port.h"
#include "castmesh/ref.h"
#include "castmesh/supervision.h"

namespace castmesh {

class Actor;

// How to spawn an actor.
struct SpawnOptions {
  // Name part of the address; default: the class name without namespace.
  std::string name{};
  // Index part of the address; default: a fresh runtime-wide number. An
  // explicit index already taken by a live actor of that name is an error.
  std::optional<uint64_t> index{};
  // Run this actor on its own thread (for handlers that block: Python,
  // blocking I/O). Its thread is joined when the runtime shuts down.
  bool dedicated_thread = false;
};

// Identifies a timer (send_after / send_every); 0 is never a timer.
using TimerId = uint64_t;

// Names one monitor (Runtime::monitor, Actor::monitor), to end it with
// demonitor. Never 0.
using MonitorId = uint64_t;

struct RuntimeOptions {
  // Worker threads; 0 means std::thread::hardware_concurrency().
  int workers = 0;
  // Messages an actor handles per turn before yielding its worker.
  int batch = 64;
  // This proc's id (see set_proc_id).
  ProcId proc_id = "local";
  // Failures no actor handled (root of the supervision tree). Runs on the
  // thread where the failed actor stopped; must not block. Also logged.
  std::function<void(const SupervisionEvent&)> on_unhandled_failure{};
};

namespace detail {
class RuntimeCore;
class RuntimeTransportSeam;
class ActorCell;
// Registers a new actor (used by the spawn templates).
absl::StatusOr<std::shared_ptr<Destination>> spawn_actor(RuntimeCore* rt, ActorCell* parent,
                                                      std::unique_ptr<Actor> actor, const HandlerTable& table,
                                                      SpawnOptions options);
}  // namespace detail

class Runtime {
 public:
  explicit Runtime(RuntimeOptions options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Spawns an actor whose parent is the root. Constructor runs on this
  // thread; on_start runs on a worker before the first message. During
  // shutdown the returned ref is dead (sends fail).
  template <typename A, typename... Args>
  ActorRef<A> spawn(Args&&... args) {
    return spawn_child<A>(nullptr, SpawnOptions{}, std::forward<Args>(args)...).value();
  }
  template <typename A, typename... Args>
  absl::StatusOr<ActorRef<A>> spawn_with(SpawnOptions options, Args&&... args) {
    return spawn_child<A>(nullptr, std::move(options), std::forward<Args>(args)...);
  }
  // Used by Actor::spawn (parent = that actor's cell).
  template <typename A, typename... Args>
  absl::StatusOr<ActorRef<A>> spawn_child(detail::ActorCell* parent, SpawnOptions options, Args&&... args) {
    static_assert(std::is_base_of_v<Actor, A>, "actors derive from castmesh::Actor");
    auto ep = detail::spawn_actor(core_.get(), parent, std::make_unique<A>(std::forward<Args>(args)...),
                                  detail::handler_table<A>(), std::move(options));
    if (!ep.ok()) return ep.status();
    return ActorRef<A>(std::move(*ep));
  }

  // A ref to `address`: a local actor (dead ref if none lives there) or an
  // actor of another proc.
  UntypedRef resolve(const Address& address);

  // Stops every actor, then joins every thread. Idempotent. Call from a plain
  // thread (from inside an actor it only requests the stops).
  void shutdown();

  const ProcId& proc_id() const;
  // Sets this proc's id; only before the first spawn (else kFailedPrecondition).
  absl::Status set_proc_id(ProcId id);

  // Watches `target` from a plain thread: `on_down` runs once when it stops
  // (on the thread where a local target stops, or now if it is gone; for an
  // actor of another proc, on this runtime's timer thread when that proc
  // reports its stop or is lost). Must not block.
  MonitorId monitor(const UntypedRef& target, std::function<void(const DownEvent&)> on_down);
  // Ends monitor `id` of `target`. True: it was removed before `target`
  // was reported down, and its callback will never run. False: it was
  // already told (its callback may still be running) or is unknown.
  bool demonitor(const UntypedRef& target, MonitorId id);

  // Sends `msg` to `to` after `delay` / every `period` (from the timer thread).
  template <typename M>
  TimerId send_after(absl::Duration delay, UntypedRef to, M msg) {
    auto shared = std::make_shared<M>(std::move(msg));
    return add_timer(delay, absl::ZeroDuration(), [to = std::move(to), shared] { to.tell(std::move(*shared)); });
  }
  template <typename M>
  TimerId send_every(absl::Duration period, UntypedRef to, M msg) {
    return add_timer(period, period, [to = std::move(to), msg = std::move(msg)] { to.tell(M(msg)); });
  }
  // Cancels a timer; true if it had not fired (or, periodic, was active).
  bool cancel_timer(TimerId id);

  // Actors spawned and not yet stopped.
  size_t live_actors() const;
  int worker_count() const;

  // The runtime of the calling thread: the one running this actor or worker,
  // else the most recently created runtime still alive, else nullptr.
  static Runtime* current();

 private:
  friend class detail::RuntimeTransportSeam;  // the transport's entry points
  TimerId add_timer(absl::Duration delay, absl::Duration period, std::function<void()> fire);
  std::unique_ptr<detail::RuntimeCore> core_;
};

}  // namespace castmesh

// Actor and Runtime need each other; users may include either first.
#include "castmesh/actor.h"
