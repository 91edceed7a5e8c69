#include "castmesh/actor.h"

#include "core/actor/runtime_core.h"

namespace castmesh {

const Address& Actor::address() const { return cell_->address(); }
UntypedRef Actor::self() const { return UntypedRef(cell_->self_ref()); }
Runtime& Actor::runtime() const { return *cell_->runtime()->owner; }
void Actor::stop() { cell_->stop_after_current(); }
void Actor::fail(absl::Status reason) {
  if (reason.ok()) reason = absl::UnknownError("Actor::fail with an OK status");
  cell_->fail(std::move(reason), "", cell_->address());
}

MonitorId Actor::monitor(const UntypedRef& target) {
  return cell_->runtime()->monitor(target, detail::Watcher{cell_->weak_from_this(), {}});
}

bool Actor::demonitor(const UntypedRef& target, MonitorId id) { return cell_->runtime()->demonitor(target, id); }

TimerId Actor::add_timer(absl::Duration delay, absl::Duration period, std::function<void()> fire) {
  const TimerId id = cell_->runtime()->timers().add(delay, period, std::move(fire));
  if (id != 0) cell_->track_timer(id);
  return id;
}

void Actor::cancel_timer(TimerId id) {
  cell_->runtime()->timers().cancel(id);
  cell_->untrack_timer(id);
}

}  // namespace castmesh
