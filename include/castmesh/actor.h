// Actor: the base class of every actor.
//
// An actor is an object with private state that handles one message at a
// time; it may run on any scheduler thread between messages, never on two at
// once. Declare the handled messages as methods plus a handler list:
//
//   struct Add { int n; };
//   struct Get {};
//   class Counter : public castmesh::Actor {
//    public:
//     explicit Counter(int start) : value_(start) {}
//     void add(const Add& m) { value_ += m.n; }
//     int get(const Get&) { return value_; }
//     using Handlers = castmesh::Handlers<&Counter::add, &Counter::get>;
//    private:
//     int value_;
//   };
//   auto c = runtime.spawn<Counter>(5);
//   c.tell(Add{2});
//   absl::StatusOr<int> v = c.ask(Get{}).get();   // Future<int>
//
// Short handlers: a class that declares
//   static constexpr bool kShortHandlers = true;
// promises that every handler is short (microseconds) and never blocks (no
// Future::get, no collective, no sleep). A message from another proc that
// finds such an actor idle then runs on the transport thread that received
// it, without waking a worker (one thread hand-off less per remote ask;
// docs/actors.md, "Short handlers"). Ordering, one handler at a time and
// supervision are as for every actor; sends from such a handler never wait
// for a full connection (they fail with ResourceExhausted instead).
//
// The methods of this base class (self, spawn, stop, monitor, timers,
// on_complete) may only be called from inside the actor's own handlers and
// hooks (on_start onwards), never from its constructor or other threads.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/time/time.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "castmesh/detail/handlers.h"
#include "castmesh/future.h"
#include "castmesh/port.h"
#include "castmesh/ref.h"
#include "castmesh/runtime.h"
#include "castmesh/supervision.h"

namespace castmesh {

class Actor {
 public:
  Actor() = default;
  Actor(const Actor&) = delete;
  Actor& operator=(const Actor&) = delete;
  virtual ~Actor() = default;

  // Hooks, run inside the actor. on_start runs before the first message;
  // on_stop when it stops (normal stop, failure or runtime shutdown), before
  // the object is destroyed. An exception from on_start fails the actor.
  virtual void on_start() {}
  virtual void on_stop() {}
  // A child failed. Return true if handled (this actor keeps running; the
  // child stays stopped); false escalates (this actor fails, its parent is
  // told). Default: escalate.
  virtual bool on_child_failed(const SupervisionEvent& event) { return false; }
  // An actor this one monitors stopped.
  virtual void on_down(const DownEvent& event) {}

 protected:
  // This actor's address and ref.
  const Address& address() const;
  UntypedRef self() const;
  template <typename A>
  ActorRef<A> self_as() const {
    return ActorRef<A>(self().destination());
  }
  Runtime& runtime() const;

  // Spawns a child (this actor is its parent and supervisor).
  template <typename A, typename... Args>
  ActorRef<A> spawn(Args&&... args);
  template <typename A, typename... Args>
  absl::StatusOr<ActorRef<A>> spawn_with(SpawnOptions options, Args&&... args);

  // Stops this actor once the current handler returns. Messages still in the
  // mailbox are dropped; their requests fail with an error naming the actor.
  void stop();
  // Fails this actor as if a handler had thrown (parent gets an event).
  void fail(absl::Status reason);

  // Watches `target`: on_down runs here when it stops (at once if it is
  // already gone).
  MonitorId monitor(const UntypedRef& target);
  // Ends monitor `id` of `target` (see Runtime::demonitor). When false, an
  // on_down for it may still be on its way to this actor.
  bool demonitor(const UntypedRef& target, MonitorId id);

  // Delivers `msg` to this actor after `delay` / every `period`. Timers end
  // when cancelled or when the actor stops.
  template <typename M>
  TimerId send_after(absl::Duration delay, M msg);
  template <typename M>
  TimerId send_every(absl::Duration period, M msg);
  void cancel_timer(TimerId id);

  // Runs `f(absl::StatusOr<T>)` inside this actor (one at a time with its
  // handlers) once `future` completes. Dropped if the actor stopped first.
  template <typename T, typename F>
  void on_complete(Future<T> future, F f);

 private:
  friend class detail::ActorCell;
  friend struct ActorAccess;
  TimerId add_timer(absl::Duration delay, absl::Duration period, std::function<void()> fire);
  detail::ActorCell* cell_ = nullptr;
};


template <typename A, typename... Args>
ActorRef<A> Actor::spawn(Args&&... args) {
  return runtime().spawn_child<A>(cell_, SpawnOptions{}, std::forward<Args>(args)...).value();
}
template <typename A, typename... Args>
absl::StatusOr<ActorRef<A>> Actor::spawn_with(SpawnOptions options, Args&&... args) {
  return runtime().spawn_child<A>(cell_, std::move(options), std::forward<Args>(args)...);
}

template <typename M>
TimerId Actor::send_after(absl::Duration delay, M msg) {
  auto shared = std::make_shared<M>(std::move(msg));
  return add_timer(delay, absl::ZeroDuration(), [ref = self(), shared] { ref.tell(std::move(*shared)); });
}
template <typename M>
TimerId Actor::send_every(absl::Duration period, M msg) {
  return add_timer(period, period, [ref = self(), msg = std::move(msg)] { ref.tell(M(msg)); });
}

namespace detail {
// The continuation of Actor::on_complete: first a future callback (stores
// the result), then the envelope that runs `fn` inside the actor. One
// allocation for both.
template <typename T, typename F>
struct ActorContinuation final : FutureCallback, ClosureEnvelope {
  ActorContinuation(std::shared_ptr<Destination> t, F f) : target(std::move(t)), fn(std::move(f)) {}
  void on_future_ready(FutureStateBase* s) override {
    result.emplace(static_cast<FutureState<T>*>(s)->take());
    std::shared_ptr<Destination> to = std::move(target);
    post(*to, this);  // the mailbox owns this envelope now
  }
  void run() override { fn(std::move(*result)); }
  std::shared_ptr<Destination> target;
  F fn;
  std::optional<absl::StatusOr<T>> result;
};
}  // namespace detail

template <typename T, typename F>
void Actor::on_complete(Future<T> future, F f) {
  if (!future.valid()) future = make_failed_future<T>(absl::FailedPreconditionError("invalid future"));
  std::move(future).on_ready_callback(new detail::ActorContinuation<T, F>(self().destination(), std::move(f)));
}

}  // namespace castmesh
