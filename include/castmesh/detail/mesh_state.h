// Internal: the state shared by every view (ActorMesh handle) of one
// spawned mesh: its members, its router, their health and its failure
// policy. Used by ActorMesh; public only because ActorMesh is a template.
// Implemented in src/core/mesh/actor_mesh.cc.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/mesh_options.h"
#include "castmesh/ref.h"
#include "castmesh/runtime.h"
#include "castmesh/shape.h"
#include "castmesh/supervision.h"

namespace castmesh::detail {

class MeshRouter;

// State shared by every view of one spawned mesh. Thread-safe.
class MeshState : public std::enable_shared_from_this<MeshState> {
 public:
  MeshState(std::string name, Shape base, size_t fanout, MeshFailureHandler on_failure);
  ~MeshState();

  const std::string& name() const { return name_; }
  const Shape& base() const { return base_; }
  size_t default_fanout() const { return fanout_; }

  // Set once, by ActorMesh::Create, before the mesh is shared: the members
  // by base rank and the router chosen for them (detail/mesh_router.h).
  void set_members(std::vector<UntypedRef> members, std::unique_ptr<MeshRouter> router);
  // How casts and requests reach the members (set_members' router).
  MeshRouter& router() const { return *router_; }
  // Monitors every member through `runtime` (after set_members).
  void watch_members(Runtime& runtime);

  const UntypedRef& member(size_t rank) const { return members_[rank]; }

  // OK when the mesh runs and no member of `view` is known to be dead;
  // else FailedPrecondition (stopped mesh) or Unavailable naming every
  // dead point of the view.
  absl::Status check_view(const Shape& view) const;
  // Whether the member at base rank `rank` is known to be dead.
  bool is_dead(size_t rank) const;
  // Every member stop seen so far, in order.
  std::vector<MeshEvent> events() const;
  // Stops every member and the router; later requests fail with `reason`.
  void stop(absl::Status reason);

  // choose(): the live member of `view` with the fewest requests in flight
  // from choose(); among equals the next one round-robin (positions of the
  // view, one cursor per mesh, as Python's choose); Unavailable if none is alive.
  absl::StatusOr<size_t> pick_member(const Shape& view);
  // choose() bookkeeping: a request to `rank` started / finished.
  void request_started(size_t rank);
  void request_finished(size_t rank);

  // The runtime's monitor: the member at `rank` stopped.
  void on_member_down(size_t rank, const DownEvent& event);
  // The last ActorMesh handle is gone: never call the failure handler again
  // (waits for a call in progress to return).
  void detach();

 private:
  const std::string name_;
  const Shape base_;
  const size_t fanout_;
  detail::Mutex handler_mu_;  // held while the failure handler runs
  bool detached_ ABSL_GUARDED_BY(handler_mu_) = false;
  const MeshFailureHandler on_failure_;
  std::vector<UntypedRef> members_;
  std::unique_ptr<MeshRouter> router_;
  std::unique_ptr<std::atomic<int>[]> in_flight_;

  mutable detail::Mutex mu_;
  std::vector<bool> dead_ ABSL_GUARDED_BY(mu_);
  std::vector<MeshEvent> events_ ABSL_GUARDED_BY(mu_);
  absl::Status stopped_ ABSL_GUARDED_BY(mu_);  // non-OK once stopped
  size_t next_choice_ ABSL_GUARDED_BY(mu_) = 0;  // pick_member's round-robin cursor
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

}  // namespace castmesh::detail
