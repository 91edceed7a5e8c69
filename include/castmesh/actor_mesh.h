// ActorMesh<A>: one actor of class A per point of a Shape, messaged as one
// object (DESIGN.md §2, docs/meshes.md).
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
#include <atomic>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "castmesh/actor.h"
#include "castmesh/cast_tree.h"
#include "castmesh/detail/mesh_reply.h"
#include "castmesh/detail/proc_cast.h"
#include "castmesh/detail/slot_collector.h"
#include "castmesh/future.h"
#include "castmesh/port.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/ref.h"
#include "castmesh/runtime.h"
#include "castmesh/shape.h"
#include "castmesh/supervision.h"
#include "castmesh/value_mesh.h"

namespace castmesh {

// A member of a mesh stopped. `point` is its point in the mesh as spawned.
struct MeshEvent {
  std::string mesh;      // the mesh's name
  Point point;
  Address actor;
  absl::Status reason;   // non-OK: it failed; OK: it was stopped normally

  // "mesh 'worker' member {hosts=1, gpus=2} (local/worker[6]) failed: ..."
  std::string to_string() const;
};

// What a mesh does after one of its members failed.
enum class MeshFailureAction {
  kStop,      // stop every member; later requests fail naming the failure
  kContinue,  // keep the survivors; requests that include dead points fail
};

// Decides what to do about a failed member. Runs on the thread where the
// member stopped; must not block.
using MeshFailureHandler = std::function<MeshFailureAction(const MeshEvent&)>;

// How ActorMesh::Spawn names a mesh's members, shapes its cast tree and
// handles a member's failure. A plain value; copy it freely.
struct MeshOptions {
  // Name of the member actors (their addresses are proc/name[rank]); the
  // in-process forwarding actors (a mesh whose members are all in this
  // process) are named name + "-cast". Default: the class name.
  std::string name{};
  // Fan-out of the cast tree (over members in process, over procs across
  // procs); a value >= the number of nodes is direct fan-out.
  size_t fanout = 8;
  // Default (empty): log the event and stop the mesh.
  MeshFailureHandler on_failure = nullptr;
};

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

namespace detail {

struct CastHop;

// One cast or request travelling down the tree; shared by all its hops.
struct CastWork {
  virtual ~CastWork() = default;
  // Runs inside the forwarding actor at hop.span.begin.
  virtual void run(const CastHop& hop) const = 0;
};

// The message between forwarding actors: which work, which span of the
// base mesh this hop is responsible for, and (for reductions) where the
// subtree's partial result goes.
struct CastHop {
  std::shared_ptr<const CastWork> work;
  CastSpan span;
  std::shared_ptr<void> up;  // ReduceNode<R> of the parent (reductions only)
  size_t up_slot = 0;
};

// The forwarding actor of one member of a mesh whose members all live in
// this process (across procs the procs' cast relays forward instead,
// detail/proc_cast.h).
class MeshForwarder : public Actor {
 public:
  void hop(const CastHop& h) { h.work->run(h); }
  using Handlers = castmesh::Handlers<&MeshForwarder::hop>;
};

// State shared by every view of one spawned mesh. Thread-safe.
class MeshState : public std::enable_shared_from_this<MeshState> {
 public:
  MeshState(std::string name, Shape base, size_t fanout, MeshFailureHandler on_failure);
  ~MeshState();

  const std::string& name() const { return name_; }
  const Shape& base() const { return base_; }
  size_t default_fanout() const { return fanout_; }

  // Set once, by Spawn, before the mesh is shared. `proc_tree` (members in
  // other procs) replaces the in-process forwarders.
  void set_members(std::vector<UntypedRef> members, std::vector<ActorRef<MeshForwarder>> forwarders,
                   std::shared_ptr<ProcCastTree> proc_tree = nullptr);
  // The per-proc cast tree, or nullptr when every member is in this process.
  const std::shared_ptr<ProcCastTree>& proc_tree() const { return proc_tree_; }
  // Monitors every member through `runtime` (after set_members).
  void watch_members(Runtime& runtime);

  const UntypedRef& member(size_t rank) const { return members_[rank]; }
  const ActorRef<MeshForwarder>& forwarder(size_t rank) const { return forwarders_[rank]; }

  // OK when the mesh runs and no member of `view` is known to be dead;
  // else FailedPrecondition (stopped mesh) or Unavailable naming every
  // dead point of the view.
  absl::Status check_view(const Shape& view) const;
  bool is_dead(size_t rank) const;
  // Every member stop seen so far, in order.
  std::vector<MeshEvent> events() const;
  // Stops every member and forwarder; later requests fail with `reason`.
  void stop(absl::Status reason);

  // choose(): the live member of `view` with the fewest requests in flight
  // from choose() (ties broken at random); Unavailable if none is alive.
  absl::StatusOr<size_t> pick_member(const Shape& view);
  void request_started(size_t rank);
  void request_finished(size_t rank);

  void on_member_down(size_t rank, const DownEvent& event);
  // The last ActorMesh handle is gone: never call the failure handler again
  // (waits for a call in progress to return).
  void detach();

 private:
  const std::string name_;
  const Shape base_;
  const size_t fanout_;
  std::mutex handler_mu_;  // held while the failure handler runs
  bool detached_ = false;  // guarded by handler_mu_
  const MeshFailureHandler on_failure_;
  std::vector<UntypedRef> members_;
  std::string directory_key_;  // in-process meshes: its entry in mesh::MeshDirectory
  std::vector<ActorRef<MeshForwarder>> forwarders_;
  std::shared_ptr<ProcCastTree> proc_tree_;
  std::unique_ptr<std::atomic<int>[]> in_flight_;

  mutable std::mutex mu_;  // guards the members below
  std::vector<bool> dead_;
  std::vector<MeshEvent> events_;
  absl::Status stopped_;  // non-OK once stopped
  std::mt19937 rng_{12345};
};

// Owned by the ActorMesh handles of one spawned mesh (not by work in flight):
// when the last handle goes, the failure handler is detached.
struct MeshOwner {
  explicit MeshOwner(std::shared_ptr<MeshState> s) : state(std::move(s)) {}
  MeshOwner(const MeshOwner&) = delete;
  MeshOwner& operator=(const MeshOwner&) = delete;
  ~MeshOwner() { state->detach(); }
  std::shared_ptr<MeshState> state;
};

// Work that follows a CastRoute; forwards to the hop's children first (so
// they start early), then does the local part.
struct RoutedWork : CastWork {
  RoutedWork(std::shared_ptr<MeshState> m, CastRoute r, Shape v)
      : mesh(std::move(m)), route(std::move(r)), view(std::move(v)) {}

  // Sends this work to the children of `hop` (slots first_slot, +1, ...).
  void forward(const CastHop& hop, const std::shared_ptr<void>& up, size_t first_slot) const {
    size_t slot = first_slot;
    for (const CastSpan& child : route.children(hop.span)) {
      mesh->forwarder(child.begin).tell(CastHop{hop.work, child, up, slot++});
    }
  }
  // Sends `work` from the root (the caller) to its children.
  static void launch(const std::shared_ptr<const RoutedWork>& work, const std::shared_ptr<void>& up) {
    size_t slot = 0;
    for (const CastSpan& child : work->route.root_children()) {
      work->mesh->forwarder(child.begin).tell(CastHop{work, child, up, slot++});
    }
  }
  // The member's point in the view (what replies are indexed by).
  Point point_of(size_t rank) const { return *view.point_of_rank(rank); }
  // The member's point in the mesh as spawned (what errors name: a point
  // of a 1-member slice would print as "{}").
  Point base_point(size_t rank) const { return *mesh->base().point_at(rank); }

  std::shared_ptr<MeshState> mesh;
  CastRoute route;
  Shape view;
};

template <typename A, typename M>
struct TellWork final : RoutedWork {
  TellWork(std::shared_ptr<MeshState> m, CastRoute r, Shape v, M message)
      : RoutedWork(std::move(m), std::move(r), std::move(v)), msg(std::move(message)) {}
  void run(const CastHop& hop) const override {
    forward(hop, nullptr, 0);
    const size_t rank = hop.span.begin;
    if (route.delivers(hop.span) && !mesh->is_dead(rank)) {
      ActorRef<A>(mesh->member(rank).endpoint()).tell(M(msg));
    }
  }
  M msg;
};

template <typename A, typename M, typename R>
struct GatherWork final : RoutedWork {
  GatherWork(std::shared_ptr<MeshState> m, CastRoute r, Shape v, M message,
             std::shared_ptr<ReplyGather<R>> g)
      : RoutedWork(std::move(m), std::move(r), std::move(v)), msg(std::move(message)),
        gather(std::move(g)) {}
  void run(const CastHop& hop) const override {
    forward(hop, nullptr, 0);
    if (!route.delivers(hop.span)) return;
    const size_t rank = hop.span.begin;
    const size_t position = point_of(rank).position();
    ActorRef<A>(mesh->member(rank).endpoint())
        .ask(M(msg))
        .on_ready([g = gather, position, base = base_point(rank)](absl::StatusOr<R> r) {
          if (r.ok()) {
            g->set_value(position, std::move(*r));
          } else {
            g->fail(member_error(base, r.status()));
          }
        });
  }
  M msg;
  std::shared_ptr<ReplyGather<R>> gather;
};

template <typename A, typename M, typename R>
struct StreamWork final : RoutedWork {
  StreamWork(std::shared_ptr<MeshState> m, CastRoute r, Shape v, M message,
             std::shared_ptr<ReplyQueue<R>> q)
      : RoutedWork(std::move(m), std::move(r), std::move(v)), msg(std::move(message)),
        queue(std::move(q)) {}
  void run(const CastHop& hop) const override {
    forward(hop, nullptr, 0);
    if (!route.delivers(hop.span)) return;
    Point point = point_of(hop.span.begin);
    ActorRef<A>(mesh->member(hop.span.begin).endpoint())
        .ask(M(msg))
        .on_ready([q = queue, point, base = base_point(hop.span.begin)](absl::StatusOr<R> r) {
          if (!r.ok()) r = member_error(base, r.status());
          q->push(point, std::move(r));
        });
  }
  M msg;
  std::shared_ptr<ReplyQueue<R>> queue;
};

// A reduction: each node folds its member's reply and its children's
// partial results (ReduceNode), and hands the result to its parent's node.
template <typename A, typename M, typename R>
struct ReduceWork final : RoutedWork {
  ReduceWork(std::shared_ptr<MeshState> m, CastRoute r, Shape v, M message, Reducer<R> red)
      : RoutedWork(std::move(m), std::move(r), std::move(v)), msg(std::move(message)),
        reducer(std::move(red)) {}
  void run(const CastHop& hop) const override {
    const bool own = route.delivers(hop.span);
    const size_t slots = (own ? 1 : 0) + route.children(hop.span).size();
    auto parent = std::static_pointer_cast<ReduceNode<R>>(hop.up);
    const size_t up_slot = hop.up_slot;
    auto node = std::make_shared<ReduceNode<R>>(slots, reducer, [parent, up_slot](absl::StatusOr<R> r) {
      if (r.ok()) {
        parent->set_value(up_slot, std::move(*r));
      } else {
        parent->fail(std::move(r).status());
      }
    });
    forward(hop, node, own ? 1 : 0);
    if (!own) return;
    Point point = base_point(hop.span.begin);
    ActorRef<A>(mesh->member(hop.span.begin).endpoint())
        .ask(M(msg))
        .on_ready([node, point](absl::StatusOr<R> r) {
          if (r.ok()) {
            node->set_value(0, std::move(*r));
          } else {
            node->fail(member_error(point, r.status()));
          }
        });
  }
  M msg;
  Reducer<R> reducer;
};

// Encodes a mesh message once for the per-proc tree.
template <typename M>
absl::Status encode_cast(const M& msg, CastRequest* request) {
  ensure_codec<M>();
  const MessageCodec* codec = codec_for(type_id<M>());
  if (codec == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("message type ", std::string(type_name<M>()),
                                                      " has no codec, and the mesh has members in other procs "
                                                      "(CASTMESH_REGISTER_MESSAGE)"));
  }
  request->message_type = codec->wire_name;
  return codec->encode(&msg, &request->message);
}

// Decodes the value of a reply that came up the per-proc tree.
template <typename R>
absl::StatusOr<R> decode_piece(const CastPiece& piece) {
  R value{};
  if (absl::Status st = decode_value(piece.value, &value); !st.ok()) return st;
  return value;
}

// The error of a batch of pieces holding failures: the first failed
// target's error naming its point, followed by the batch's other failed
// points (a lost subtree fails all its targets in one batch). nullopt when
// every piece is a value.
inline std::optional<absl::Status> pieces_error(const Shape& base, const std::vector<CastPiece>& pieces) {
  const CastPiece* first = nullptr;
  std::vector<std::string> others;
  for (const CastPiece& p : pieces) {
    if (p.error.ok()) continue;
    if (first == nullptr) {
      first = &p;
    } else {
      others.push_back(base.point_at(p.first_rank)->to_string());
    }
  }
  if (first == nullptr) return std::nullopt;
  absl::Status error = member_error(*base.point_at(first->first_rank), first->error);
  if (others.empty()) return error;
  return absl::Status(error.code(),
                      absl::StrCat(error.message(), " (also failed: ", absl::StrJoin(others, ", "), ")"));
}

// The caller's end of a reduction over the per-proc tree: pieces (each a
// run of targets, folded by relays where they could) arrive in any order,
// each counted in for the run of view positions it covers; once they cover
// every target they are folded in row-major order. The first batch holding
// an error fails the reduction.
template <typename R>
class PieceFold {
 public:
  using Done = std::function<void(absl::StatusOr<R>)>;
  PieceFold(Shape view, Reducer<R> reducer, Shape base, Done done)
      : view_(std::move(view)), slots_(view_.size()), reducer_(std::move(reducer)), base_(std::move(base)),
        done_(std::move(done)) {}

  // A batch of pieces from the tree (any thread).
  void add(std::vector<CastPiece> batch) {
    if (std::optional<absl::Status> error = pieces_error(base_, batch)) {
      if (slots_.fail()) done_(*std::move(error));
      return;
    }
    for (CastPiece& p : batch) {
      absl::StatusOr<size_t> position = view_.slice().position_of(p.first_rank);
      if (!position.ok()) {  // relays pass up only their slots' targets
        if (slots_.fail()) done_(absl::InternalError(absl::StrCat("reply for rank ", p.first_rank, " outside the view")));
        return;
      }
      const size_t count = p.count;
      SlotFill<CastPiece> fill = slots_.set(*position, std::move(p), count);
      if (fill.done) finish(*std::move(fill.done));
    }
  }

 private:
  // Every target answered: decodes and folds the pieces in row-major order.
  void finish(std::vector<CastPiece> all) {
    std::optional<R> folded;
    for (const CastPiece& p : all) {
      absl::StatusOr<R> v = decode_piece<R>(p);
      if (!v.ok()) {
        done_(member_error(*base_.point_at(p.first_rank), v.status()));
        return;
      }
      folded = folded ? reducer_.combine(std::move(*folded), *std::move(v)) : *std::move(v);
    }
    done_(std::move(*folded));
  }

  const Shape view_;
  SlotCollector<CastPiece> slots_;  // by position in view_
  const Reducer<R> reducer_;
  const Shape base_;
  const Done done_;
};

}  // namespace detail

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
    bool remote = false;
    for (const auto& m : members) {
      addresses.push_back(m.address());
      remote = remote || m.address().proc != runtime.proc_id();
    }
    if (remote) {  // members in other procs: the tree's nodes are the procs' relays
      absl::StatusOr<std::shared_ptr<detail::ProcCastTree>> tree =
          detail::ProcCastTree::Create(runtime, options.name, *base, addresses);
      if (!tree.ok()) return tree.status();
      auto state = std::make_shared<detail::MeshState>(options.name, *base, options.fanout,
                                                       std::move(options.on_failure));
      state->set_members(std::vector<UntypedRef>(members.begin(), members.end()), {}, *std::move(tree));
      state->watch_members(runtime);
      return ActorMesh(std::make_shared<detail::MeshOwner>(state), *base, options.fanout);
    }
    std::vector<ActorRef<detail::MeshForwarder>> forwarders;
    for (size_t rank = 0; rank < base->size(); ++rank) {
      absl::StatusOr<ActorRef<detail::MeshForwarder>> forwarder = runtime.spawn_with<detail::MeshForwarder>(
          SpawnOptions{.name = options.name + "-cast", .index = rank});
      if (!forwarder.ok()) {
        for (auto& f : forwarders) f.stop();
        return forwarder.status();
      }
      forwarders.push_back(*forwarder);
    }
    auto state = std::make_shared<detail::MeshState>(options.name, *base, options.fanout,
                                                     std::move(options.on_failure));
    state->set_members(std::vector<UntypedRef>(members.begin(), members.end()), std::move(forwarders));
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
    return ActorRef<A>(state_->member(point.rank()).endpoint());
  }
  // Every member, in row-major order of shape().
  std::vector<ActorRef<A>> refs() const {
    std::vector<ActorRef<A>> out;
    for (size_t rank : view_.slice().ranks()) out.emplace_back(state_->member(rank).endpoint());
    return out;
  }

  // Sends `msg` to every live member of this mesh (fire and forget). Errors:
  // the mesh was stopped.
  template <typename M>
  absl::Status cast(M msg) const {
    (void)sizeof(detail::HandlerFor<A, std::decay_t<M>>);
    absl::Status st = state_->check_view(view_);
    if (!st.ok() && st.code() == absl::StatusCode::kFailedPrecondition) return st;
    if (const auto& tree = state_->proc_tree()) {
      detail::CastRequest request = proc_request(detail::CastMode::kTell);
      if (absl::Status encoded = detail::encode_cast(msg, &request); !encoded.ok()) return encoded;
      return tree->send(std::move(request), nullptr);
    }
    auto route = route_for_view();
    if (!route.ok()) return route.status();
    auto work = std::make_shared<const detail::TellWork<A, std::decay_t<M>>>(state_, *std::move(route),
                                                                           view_, std::move(msg));
    detail::RoutedWork::launch(work, nullptr);
    return absl::OkStatus();
  }

  // Asks every member; resolves with one reply per point, or with the first
  // error (naming the member's point). Fails at once if a member of this
  // view is known to be dead (naming every dead point) or the mesh stopped.
  template <typename M>
  Future<ValueMesh<reply_t<M>>> call(M msg) const {
    using R = reply_t<M>;
    if (absl::Status st = state_->check_view(view_); !st.ok()) return make_failed_future<ValueMesh<R>>(st);
    auto route = route_for_view();
    if (!route.ok()) return make_failed_future<ValueMesh<R>>(route.status());
    auto [port, future] = make_once_port<ValueMesh<R>>();
    auto gather = std::make_shared<detail::ReplyGather<R>>(
        view_, [port = std::move(port)](absl::StatusOr<ValueMesh<R>> r) {
          if (r.ok()) {
            port.send(*std::move(r));
          } else {
            port.fail(std::move(r).status());
          }
        });
    if (const auto& tree = state_->proc_tree()) {
      detail::CastRequest request = proc_request(detail::CastMode::kGather);
      absl::Status sent = detail::encode_cast(msg, &request);
      if (sent.ok()) {
        sent = tree->send(std::move(request), [gather, view = view_, base = state_->base()](
                                                  std::vector<detail::CastPiece> pieces) {
          if (std::optional<absl::Status> error = detail::pieces_error(base, pieces)) {
            gather->fail(*std::move(error));
            return;
          }
          for (const detail::CastPiece& p : pieces) {
            absl::StatusOr<R> v = detail::decode_piece<R>(p);
            if (!v.ok()) {
              gather->fail(detail::member_error(*base.point_at(p.first_rank), v.status()));
              return;
            }
            gather->set_value(*view.slice().position_of(p.first_rank), *std::move(v));
          }
        });
      }
      if (!sent.ok()) gather->fail(sent);
      return std::move(future);
    }
    auto work = std::make_shared<const detail::GatherWork<A, std::decay_t<M>, R>>(
        state_, *std::move(route), view_, std::move(msg), std::move(gather));
    detail::RoutedWork::launch(work, nullptr);
    return std::move(future);
  }

  // Asks every member and folds the replies with `reducer` on the way back
  // up the cast tree (row-major order; the reducer must be associative).
  template <typename M>
  Future<reply_t<M>> call(M msg, Reducer<reply_t<M>> reducer) const {
    using R = reply_t<M>;
    if (absl::Status st = state_->check_view(view_); !st.ok()) return make_failed_future<R>(st);
    auto route = route_for_view();
    if (!route.ok()) return make_failed_future<R>(route.status());
    auto [port, future] = make_once_port<R>();
    if (const auto& tree = state_->proc_tree()) {
      auto fold = std::make_shared<detail::PieceFold<R>>(
          view_, reducer, state_->base(), [port = std::move(port)](absl::StatusOr<R> r) {
            if (r.ok()) {
              port.send(*std::move(r));
            } else {
              port.fail(std::move(r).status());
            }
          });
      detail::CastRequest request = proc_request(detail::CastMode::kReduce);
      if (reducer.registered) {
        request.reducer = reducer.name;
        request.reducer_type = std::string(type_name<R>());
      }
      absl::Status sent = detail::encode_cast(msg, &request);
      if (sent.ok()) {
        sent = tree->send(std::move(request),
                          [fold](std::vector<detail::CastPiece> pieces) { fold->add(std::move(pieces)); });
      }
      if (!sent.ok()) fold->add({detail::CastPiece{view_.slice().rank_at(0).value_or(0), 1, sent, {}}});
      return std::move(future);
    }
    const size_t top_slots = route->root_children().size();
    auto root = std::make_shared<detail::ReduceNode<R>>(
        top_slots, reducer, [port = std::move(port)](absl::StatusOr<R> r) {
          if (r.ok()) {
            port.send(*std::move(r));
          } else {
            port.fail(std::move(r).status());
          }
        });
    auto work = std::make_shared<const detail::ReduceWork<A, std::decay_t<M>, R>>(
        state_, *std::move(route), view_, std::move(msg), std::move(reducer));
    detail::RoutedWork::launch(work, root);
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
  // flight, ties broken at random. Errors: no live member.
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
    ActorRef<A>(state_->member(*rank).endpoint())
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
    absl::Status st = state_->check_view(view_);
    auto route = route_for_view();
    if (!route.ok()) st = route.status();
    if (!st.ok()) {
      for (const Point& p : view_.points()) queue->push(p, st);
      return ReplyStream<R>(queue);
    }
    if (const auto& tree = state_->proc_tree()) {
      detail::CastRequest request = proc_request(detail::CastMode::kStream);
      absl::Status sent = detail::encode_cast(msg, &request);
      if (sent.ok()) {
        sent = tree->send(std::move(request), [queue, view = view_, base = state_->base()](
                                                  std::vector<detail::CastPiece> pieces) {
          for (const detail::CastPiece& p : pieces) {
            absl::StatusOr<R> v = p.error.ok() ? detail::decode_piece<R>(p) : absl::StatusOr<R>(p.error);
            if (!v.ok()) v = detail::member_error(*base.point_at(p.first_rank), v.status());
            queue->push(*view.point_of_rank(p.first_rank), std::move(v));
          }
        });
      }
      if (!sent.ok()) {
        for (const Point& p : view_.points()) queue->push(p, sent);
      }
      return ReplyStream<R>(queue);
    }
    auto work = std::make_shared<const detail::StreamWork<A, std::decay_t<M>, R>>(
        state_, *std::move(route), view_, std::move(msg), queue);
    detail::RoutedWork::launch(work, nullptr);
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

  // A request over the per-proc tree for this view and fan-out.
  detail::CastRequest proc_request(detail::CastMode mode) const {
    detail::CastRequest request;
    request.mode = mode;
    request.view = view_.slice();
    request.fanout = fanout_;
    return request;
  }
  absl::StatusOr<CastRoute> route_for_view() const {
    return CastRoute::Create(state_->base().size(), view_.slice(), fanout_);
  }
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
