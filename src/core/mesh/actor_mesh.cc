// The non-template part of ActorMesh: the shared state of a spawned mesh
// (members, router, health, supervision policy).
#include "castmesh/detail/mesh_state.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "castmesh/detail/mesh_router.h"
#include "castmesh/detail/mutex.h"
#include "core/log/log.h"

namespace castmesh {

std::string MeshEvent::to_string() const {
  return absl::StrCat("mesh '", mesh, "' member ", point.to_string(), " (", actor.to_string(), ") ",
                      reason.ok() ? "stopped" : absl::StrCat("failed: ", reason.ToString()));
}

namespace detail {

MeshState::MeshState(std::string name, Shape base, size_t fanout, MeshFailureHandler on_failure)
    : name_(std::move(name)),
      base_(std::move(base)),
      fanout_(fanout),
      on_failure_(std::move(on_failure)),
      in_flight_(new std::atomic<int>[base_.size()]),
      dead_(base_.size(), false) {
  for (size_t i = 0; i < base_.size(); ++i) in_flight_[i].store(0, std::memory_order_relaxed);
}

MeshState::~MeshState() = default;

void MeshState::set_members(std::vector<UntypedRef> members, std::unique_ptr<MeshRouter> router) {
  members_ = std::move(members);
  router_ = std::move(router);
}

void MeshState::watch_members(Runtime& runtime) {
  std::weak_ptr<MeshState> weak = weak_from_this();
  for (size_t rank = 0; rank < members_.size(); ++rank) {
    runtime.monitor(members_[rank], [weak, rank](const DownEvent& event) {
      if (auto self = weak.lock()) self->on_member_down(rank, event);
    });
  }
}

absl::Status MeshState::check_view(const Shape& view) const {
  detail::MutexLock lock(mu_);
  if (!stopped_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("mesh '", name_, "' is stopped: ", stopped_.message()));
  }
  std::vector<std::string> dead_points;
  for (size_t rank : view.slice().ranks()) {
    if (dead_[rank]) dead_points.push_back(base_.point_at(rank)->to_string());
  }
  if (dead_points.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("mesh '", name_, "' has dead members at ",
                                             absl::StrJoin(dead_points, ", ")));
}

bool MeshState::is_dead(size_t rank) const {
  detail::MutexLock lock(mu_);
  return dead_[rank];
}

std::vector<MeshEvent> MeshState::events() const {
  detail::MutexLock lock(mu_);
  return events_;
}

void MeshState::stop(absl::Status reason) {
  {
    detail::MutexLock lock(mu_);
    if (!stopped_.ok()) return;
    stopped_ = reason.ok() ? absl::CancelledError("stopped") : std::move(reason);
  }
  for (const UntypedRef& m : members_) m.stop();
  if (router_) router_->stop();
}

absl::StatusOr<size_t> MeshState::pick_member(const Shape& view) {
  // One pass from the round-robin cursor: the first live member with the
  // fewest requests in flight, so equals take turns (as Python's choose).
  const std::vector<size_t> ranks = view.slice().ranks();
  detail::MutexLock lock(mu_);
  const size_t n = ranks.size();
  const size_t start = n == 0 ? 0 : next_choice_ % n;
  size_t best = n;
  int best_load = 0;
  for (size_t k = 0; k < n; ++k) {
    const size_t position = (start + k) % n;
    if (dead_[ranks[position]]) continue;
    int load = in_flight_[ranks[position]].load(std::memory_order_relaxed);
    if (best == n || load < best_load) {
      best = position;
      best_load = load;
    }
  }
  if (best == n) {
    return absl::UnavailableError(
        absl::StrCat("mesh '", name_, "' ", view.to_string(), " has no live member to choose"));
  }
  next_choice_ = best + 1;
  return ranks[best];
}

void MeshState::request_started(size_t rank) { in_flight_[rank].fetch_add(1, std::memory_order_relaxed); }
void MeshState::request_finished(size_t rank) { in_flight_[rank].fetch_sub(1, std::memory_order_relaxed); }

void MeshState::on_member_down(size_t rank, const DownEvent& event) {
  MeshEvent mesh_event{name_, *base_.point_at(rank), event.actor, event.reason};
  {
    detail::MutexLock lock(mu_);
    if (dead_[rank]) return;
    dead_[rank] = true;
    // Once the mesh is stopped, its members going down is the stop itself
    // (whatever reason the runtime gives), not news.
    if (!stopped_.ok()) return;
    events_.push_back(mesh_event);
  }
  if (event.reason.ok()) {
    CASTMESH_LOG_DEBUG("{}", mesh_event.to_string());
    return;
  }
  MeshFailureAction action = MeshFailureAction::kStop;
  {
    detail::MutexLock lock(handler_mu_);
    if (detached_) {
      CASTMESH_LOG_WARN("{} (no handle of the mesh is left; nothing done)", mesh_event.to_string());
      return;
    }
    if (on_failure_) {
      action = on_failure_(mesh_event);
    } else {
      CASTMESH_LOG_ERROR("{}; stopping the mesh (set MeshOptions::on_failure to decide otherwise)",
                         mesh_event.to_string());
    }
  }
  if (action == MeshFailureAction::kStop) {
    stop(absl::AbortedError(mesh_event.to_string()));
  }
}

void MeshState::detach() {
  detail::MutexLock lock(handler_mu_);
  detached_ = true;
}

}  // namespace detail
}  // namespace castmesh
