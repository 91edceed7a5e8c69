// ActorMesh<A>: one actor of class A per point of a Shape, messaged as one
// object (docs/meshes.md).
//
//   auto mesh = *castmesh::ActorMesh<Worker>::Spawn(runtime, shape, {.name = "worker"}, args...);
//   mesh.cast(Step{});                                  // everyone, fire and forget
//   auto gpu1 = *mesh.slice("gpus", 1);                 // a sub-mesh (a view; nothing copied)
//   ValueMesh<int> v = *gpu1.call(GetValue{}).get();    // a value per point
//   int total = *mesh.call(GetValue{}, reducers::sum<int>()).get();
//
// Delivery. cast/call/call_one/stream travel along the cast tree of the mesh
// (castmesh/cast_tree.h): each node delivers to its member(s) and forwards
// to at most `fanout` children, so the sender sends O(fanout) messages. In
// one process the nodes are forwarding actors, one per member; across procs
// they are the procs' cast relays (see "Across procs" below). Two messages
// from one sender through the tree reach every member in the order they
// were sent, whatever slices they target (the path to a member is fixed by
// the base mesh; every hop is FIFO per sender). choose() sends directly to
// one member.
//
// Supervision. The mesh monitors its members. A member that fails (its
// handler threw, or it was failed) produces a MeshEvent naming its point;
// the mesh's failure handler decides to stop the whole mesh or continue on
// the survivors. Requests pending at a member that dies fail promptly with
// an error naming the member's point; a call to a view that contains a
// known-dead member fails at once naming all such points; cast skips dead
// members. A member stopped normally (reason OK) is recorded but is not a
// failure event.
//
// Lifetime. The members live until mesh.stop() or the runtime's shutdown;
// dropping the last ActorMesh handle does not stop them, but from then on
// the failure handler is no longer called (it may capture things that die
// with the handles).
//
// Threading. An ActorMesh is an immutable handle (a view plus a shared
// state): copy it freely and use it from any thread, including from inside
// actors. Futures it returns follow castmesh::Future's rules (don't block in
// a pooled actor). The failure handler runs on the thread where the member
// stopped and must not block.
//
// Across procs. When members live in other procs (Spawn(procs, ...), or
// Create over remote refs), the tree's nodes are the procs themselves: the
// cast relay of every proc (detail/proc_cast.h) delivers to its own members
// and forwards to at most `fanout` child procs, so the caller's process
// sends at most `fanout` wire messages per cast or request; replies come
// back up the tree, one message per subtree, and a reduction with a
// registered reducer (Reducer::registered) is folded by the relays on the
// way. Messages and replies then need codecs. See docs/meshes.md.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "castmesh/actor.h"
#include "castmesh/detail/mesh_calls.h"
#include "castmesh/detail/mesh_reply.h"
#include "castmesh/detail/mesh_router.h"
#include "castmesh/detail/mesh_state.h"
#include "castmesh/future.h"
#include "castmesh/mesh_options.h"
#include "castmesh/port.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/ref.h"
#include "castmesh/runtime.h"
#include "castmesh/shape.h"
#include "castmesh/value_mesh.h"

namespace castmesh {

// The replies of ActorMesh::stream, in arrival order.
template <typename R>
class ReplyStream {
 public:
  // The next reply: its point and its value or error. Blocks up to
  // `timeout`: DeadlineExceeded when none arrived in time, OutOfRange after
  // the last one.
  absl::StatusOr<std::pair<Point, absl::StatusOr<R>>> next(
      absl::Duration timeout = absl::InfiniteDuration()) {
    return queue_->next(timeout);
  }
  // Number of replies the stream will produce (one per member).
  size_t size() const { return queue_->expected(); }

 private:
  template <typename A>
  friend class ActorMesh;
  explicit ReplyStream(std::shared_ptr<detail::ReplyQueue<R>> queue) : queue_(std::move(queue)) {}
  std::shared_ptr<detail::ReplyQueue<R>> queue_;
};

// One actor of class A per point of a Shape, messaged as one object (see
// the top of this file). How messages travel is the mesh's router, chosen
// once by Create (castmesh/detail/mesh_router.h).
template <typename A>
class ActorMesh {
 public:
  // The answer type of A's handler for M (Unit for void/Status handlers).
  template <typename M>
  using reply_t = typename detail::HandlerFor<A, std::decay_t<M>>::reply_type;

  // Spawns one A per point of `shape` in `runtime`, each constructed from a
  // copy of `args`. Member at base rank r is addressed proc/name[r]. Errors:
  // a spawn failure (e.g. the name/indices are taken); members already
  // spawned are stopped again.
  template <typename... Args>
  static absl::StatusOr<ActorMesh> Spawn(Runtime& runtime, const Shape& shape, MeshOptions options,
                                         const Args&... args) {
    if (options.name.empty()) options.name = default_name();
    std::vector<ActorRef<A>> members;
    for (size_t rank = 0; rank < shape.size(); ++rank) {
      absl::StatusOr<ActorRef<A>> member =
          runtime.spawn_with<A>(SpawnOptions{.name = options.name, .index = rank}, args...);
      if (!member.ok()) {
        for (auto& m : members) m.stop();
        return member.status();
      }
      members.push_back(*member);
    }
    absl::StatusOr<ActorMesh> mesh = Create(runtime, shape, members, std::move(options));
    if (!mesh.ok()) {
      for (auto& m : members) m.stop();
    }
    return mesh;
  }

  // Spawns one A on every proc of `procs` (ProcMesh::spawn: A must be
  // registered with CASTMESH_REGISTER_ACTOR, messages need codecs); the
  // mesh has the proc mesh's shape (of a slice: its dimensions, numbered
  // 0..n-1 row-major).
  template <typename... Args>
  static absl::StatusOr<ActorMesh> Spawn(const ProcMesh& procs, MeshOptions options, const Args&... args) {
    return Spawn(procs, procs.shape(), std::move(options), args...);
  }

  // Same, giving the members `shape` instead, whose size must equal the
  // number of procs (the proc at row-major position r of procs.shape() is
  // the point at row-major position r of `shape`). The cast tree's nodes
  // are the procs' cast relays (see "Meshes over procs" in docs/meshes.md).
  template <typename... Args>
  static absl::StatusOr<ActorMesh> Spawn(const ProcMesh& procs, const Shape& shape, MeshOptions options,
                                         const Args&... args) {
    if (shape.size() != procs.size()) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", shape.to_string(), " has ", shape.size(),
                                                     " points but the proc mesh has ", procs.size(), " procs"));
    }
    if (options.name.empty()) options.name = default_name();
    absl::StatusOr<std::vector<ActorRef<A>>> members = procs.spawn<A>(options.name, args...);
    if (!members.ok()) return members.status();
    return Create(procs.runtime(), shape, *std::move(members), std::move(options));
  }

  // A mesh over actors that already exist (e.g. spawned by other means), the
  // member at base rank r being members[r] (row-major order of `shape`).
  // Monitors the members. All members in this process: spawns the
  // forwarding actors in `runtime`. Some in other procs (then `runtime` must
  // be a proc): installs the mesh's table in the cast relay of every proc
  // holding a member (blocks for their answers); the tree's nodes are those
  // procs, in the order their first member appears. Errors: a member count
  // that differs from shape.size(), fanout 0, the forwarders' names taken,
  // a proc that does not answer.
  static absl::StatusOr<ActorMesh> Create(Runtime& runtime, const Shape& shape,
                                          const std::vector<ActorRef<A>>& members, MeshOptions options) {
    if (options.fanout == 0) return absl::InvalidArgumentError("mesh cast fan-out must be at least 1");
    if (options.name.empty()) options.name = default_name();
    if (members.size() != shape.size()) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", shape.to_string(), " has ", shape.size(),
                                                     " points but ", members.size(), " members were given"));
    }
    // The mesh is numbered 0..n-1 whatever view `shape` was.
    absl::StatusOr<Shape> base = Shape::Create(shape.labels(), *Slice::RowMajor(shape.sizes()));
    if (!base.ok()) return base.status();
    std::vector<Address> addresses;
    for (const auto& m : members) addresses.push_back(m.address());
    absl::StatusOr<std::unique_ptr<detail::MeshRouter>> router =
        detail::make_mesh_router(runtime, options.name, *base, addresses);
    if (!router.ok()) return router.status();
    auto state = std::make_shared<detail::MeshState>(options.name, *base, options.fanout,
                                                     std::move(options.on_failure));
    state->set_members(std::vector<UntypedRef>(members.begin(), members.end()), *std::move(router));
    state->watch_members(runtime);
    return ActorMesh(std::make_shared<detail::MeshOwner>(state), *base, options.fanout);
  }

  // The points this (possibly sliced) mesh covers.
  const Shape& shape() const { return view_; }
  size_t size() const { return view_.size(); }
  const std::string& name() const { return state_->name(); }
  size_t fanout() const { return fanout_; }

  // A sub-mesh: an index drops the dimension, a Range keeps it. Errors as
  // Shape::select.
  absl::StatusOr<ActorMesh> slice(std::string_view dim, const Selector& selector) const {
    absl::StatusOr<Shape> v = view_.select(dim, selector);
    if (!v.ok()) return v.status();
    return ActorMesh(owner_, *std::move(v), fanout_);
  }
  absl::StatusOr<ActorMesh> slice(
      std::initializer_list<std::pair<std::string_view, Selector>> selections) const {
    absl::StatusOr<Shape> v = view_.select(selections);
    if (!v.ok()) return v.status();
    return ActorMesh(owner_, *std::move(v), fanout_);
  }
  // The same mesh with another cast-tree fan-out (>= size(): direct
  // fan-out). Ordering between messages holds for one fan-out.
  ActorMesh with_fanout(size_t fanout) const {
    return ActorMesh(owner_, view_, std::max<size_t>(fanout, 1));
  }

  // The member at a point of shape() (or of the mesh it was sliced from).
  absl::StatusOr<ActorRef<A>> ref(const Point& point) const {
    absl::StatusOr<Point> own = view_.point_of_rank(point.rank());
    if (!own.ok()) return own.status();
    return ActorRef<A>(state_->member(point.rank()).destination());
  }
  // Every member, in row-major order of shape().
  std::vector<ActorRef<A>> refs() const {
    std::vector<ActorRef<A>> out;
    for (size_t rank : view_.slice().ranks()) out.emplace_back(state_->member(rank).destination());
    return out;
  }

  // Sends `msg` to every live member of this mesh (fire and forget). Errors:
  // the mesh was stopped.
  template <typename M>
  absl::Status cast(M msg) const {
    (void)sizeof(detail::HandlerFor<A, std::decay_t<M>>);
    absl::Status st = state_->check_view(view_);
    if (!st.ok() && st.code() == absl::StatusCode::kFailedPrecondition) return st;
    return state_->router().tell(view_, fanout_,
                                 std::make_shared<detail::TellCall<A, std::decay_t<M>>>(state_, std::move(msg)));
  }

  // Asks every member; resolves with one reply per point, or with the first
  // error (naming the member's point). Fails at once if a member of this
  // view is known to be dead (naming every dead point) or the mesh stopped.
  template <typename M>
  Future<ValueMesh<reply_t<M>>> call(M msg) const {
    using R = reply_t<M>;
    if (absl::Status st = state_->check_view(view_); !st.ok()) return make_failed_future<ValueMesh<R>>(st);
    auto [port, future] = make_once_port<ValueMesh<R>>();
    auto gather = std::make_shared<detail::ReplyGather<R>>(view_, detail::resolve_port(std::move(port)));
    state_->router().gather(view_, fanout_, std::make_shared<detail::GatherCall<A, std::decay_t<M>, R>>(
                                                state_, std::move(msg), std::move(gather)));
    return std::move(future);
  }

  // Asks every member and folds the replies with `reducer` on the way back
  // up the cast tree (row-major order; the reducer must be associative).
  template <typename M>
  Future<reply_t<M>> call(M msg, Reducer<reply_t<M>> reducer) const {
    using R = reply_t<M>;
    if (absl::Status st = state_->check_view(view_); !st.ok()) return make_failed_future<R>(st);
    auto [port, future] = make_once_port<R>();
    state_->router().reduce(view_, fanout_, std::make_shared<detail::ReduceCall<A, std::decay_t<M>, R>>(
                                                state_, view_.slice(), std::move(msg), std::move(reducer),
                                                detail::resolve_port(std::move(port))));
    return std::move(future);
  }

  // call() on a mesh of exactly one member, resolving with its reply.
  // Errors: InvalidArgument when the mesh has another size.
  template <typename M>
  Future<reply_t<M>> call_one(M msg) const {
    using R = reply_t<M>;
    if (view_.size() != 1) {
      return make_failed_future<R>(absl::InvalidArgumentError(
          absl::StrCat("call_one needs a mesh of one member; mesh '", name(), "' ", view_.to_string(),
                       " has ", view_.size(), " (slice it first)")));
    }
    return call(std::move(msg)).then([](ValueMesh<R> v) { return std::move(v.values().front()); });
  }

  // Asks one live member: the one with the fewest choose() requests in
  // flight from this process (load balancing; counted over the whole mesh,
  // whichever slice chose); among equals the next one round-robin, as
  // Python's choose. Errors: no live member.
  template <typename M>
  Future<reply_t<M>> choose(M msg) const {
    using R = reply_t<M>;
    if (absl::Status st = state_->check_view(view_); !st.ok() && st.code() == absl::StatusCode::kFailedPrecondition) {
      return make_failed_future<R>(st);
    }
    absl::StatusOr<size_t> rank = state_->pick_member(view_);
    if (!rank.ok()) return make_failed_future<R>(rank.status());
    state_->request_started(*rank);
    auto [port, future] = make_once_port<R>();
    ActorRef<A>(state_->member(*rank).destination())
        .ask(std::move(msg))
        .on_ready([state = state_, rank = *rank, port = std::move(port)](absl::StatusOr<R> r) {
          state->request_finished(rank);
          if (r.ok()) {
            port.send(*std::move(r));
          } else {
            port.fail(detail::member_error(*state->base().point_at(rank), r.status()));
          }
        });
    return std::move(future);
  }

  // Asks every member; the replies come out of the stream as they arrive,
  // one per member (an error for a member that failed or is dead).
  template <typename M>
  ReplyStream<reply_t<M>> stream(M msg) const {
    using R = reply_t<M>;
    auto queue = std::make_shared<detail::ReplyQueue<R>>(view_.size());
    auto call = std::make_shared<detail::StreamCall<A, std::decay_t<M>, R>>(state_, view_, std::move(msg), queue);
    if (absl::Status st = state_->check_view(view_); !st.ok()) {
      call->fail(st);
    } else {
      state_->router().stream(view_, fanout_, std::move(call));
    }
    return ReplyStream<R>(queue);
  }

  // Every member stop seen so far (failures and normal stops), in order.
  std::vector<MeshEvent> events() const { return state_->events(); }
  // Stops every member of the whole mesh (not only this slice).
  void stop() const {
    state_->stop(absl::CancelledError(absl::StrCat("mesh '", name(), "' was stopped")));
  }

 private:
  ActorMesh(std::shared_ptr<detail::MeshOwner> owner, Shape view, size_t fanout)
      : owner_(std::move(owner)), state_(owner_->state), view_(std::move(view)), fanout_(fanout) {}

  static std::string default_name() {
    std::string_view full = type_name<A>();
    size_t colon = full.rfind("::");
    return std::string(colon == std::string_view::npos ? full : full.substr(colon + 2));
  }

  std::shared_ptr<detail::MeshOwner> owner_;
  std::shared_ptr<detail::MeshState> state_;  // == owner_->state
  Shape view_;
  size_t fanout_;
};

}  // namespace castmesh
