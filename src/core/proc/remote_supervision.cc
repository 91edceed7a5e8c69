#include "core/proc/remote_supervision.h"

#include <vector>

#include "castmesh/detail/mutex.h"
#include "castmesh/detail/runtime_transport.h"
#include "castmesh/wire/v1/control.pb.h"
#include "core/log/log.h"
#include "core/proc/proc_host.h"
#include "core/trace/recorder.h"
#include "core/wire/status_code.h"

namespace castmesh::proc {

namespace v1 = wire::v1;

RemoteSupervision::RemoteSupervision(ProcHost& host) : host_(host) {
  host.on_control(v1::Supervision().GetTypeName(), [this](const ProcId& peer, uint64_t, const std::string& payload) {
    handle_supervision(peer, payload);
  });
}

void RemoteSupervision::remember_spawned(const std::string& child, const ProcId& spawner, std::string parent) {
  detail::MutexLock lock(mu_);
  spawned_for_others_[child] = {spawner, std::move(parent)};
}

void RemoteSupervision::set_root_failure_handler(std::function<void(const SupervisionEvent&)> handler) {
  detail::MutexLock lock(mu_);
  root_failure_handler_ = std::move(handler);
}

uint64_t RemoteSupervision::add_failure_observer(FailureObserver observer) {
  return failure_observers_.add(std::move(observer));
}

void RemoteSupervision::remove_failure_observer(uint64_t id) { failure_observers_.remove(id); }

void RemoteSupervision::deliver_failure(const std::string& parent, SupervisionEvent event) {
  if (!parent.empty()) {
    auto address = Address::parse(parent);
    if (address.ok() && detail::RuntimeTransportSeam::deliver_supervision_event(host_.runtime(), *address, event).ok()) {
      return;
    }
    CASTMESH_LOG_WARN("castmesh-proc {}: parent {} of failed actor {} is gone; reporting to the root", host_.id(),
                      log::printable(parent), log::printable(event.child.to_string()));
  }
  std::function<void(const SupervisionEvent&)> handler;
  {
    detail::MutexLock lock(mu_);
    handler = root_failure_handler_;
  }
  if (handler) {
    handler(event);
  } else {
    CASTMESH_LOG_ERROR("castmesh-proc {}: remote actor {} failed: {}", host_.id(),
                       log::printable(event.child.to_string()), log::printable(event.reason.ToString(), 4096));
  }
}

bool RemoteSupervision::forward_failure(const SupervisionEvent& event) {
  std::pair<ProcId, std::string> spawner;
  {
    detail::MutexLock lock(mu_);
    auto it = spawned_for_others_.find(event.child.to_string());
    if (it == spawned_for_others_.end()) return false;
    spawner = std::move(it->second);
    spawned_for_others_.erase(it);
  }
  v1::Supervision message;
  message.set_parent(spawner.second);
  message.set_child(event.child.to_string());
  message.set_reason_code(static_cast<int>(event.reason.code()));
  message.set_reason_message(std::string(event.reason.message()));
  message.set_message_type(event.message_type);
  message.set_origin(event.origin.to_string());
  if (absl::Status st = host_.send_control(spawner.first, message); !st.ok()) {
    CASTMESH_LOG_WARN("castmesh-proc {}: cannot report failure of {} to {}: {}", host_.id(), event.child.to_string(),
                      spawner.first, st.ToString());
  }
  return true;
}

void RemoteSupervision::handle_supervision(const ProcId& peer, const std::string& payload) {
  v1::Supervision message;
  if (!message.ParseFromString(payload)) {
    CASTMESH_LOG_WARN("castmesh-proc {}: malformed Supervision from {}", host_.id(), peer);
    return;
  }
  SupervisionEvent event;
  if (auto child = Address::parse(message.child()); child.ok()) event.child = *child;
  if (auto origin = Address::parse(message.origin()); origin.ok()) event.origin = *origin;
  event.reason = wire::status_from_wire(message.reason_code(), message.reason_message());
  if (event.reason.ok()) event.reason = absl::UnknownError("remote actor failed");
  event.message_type = message.message_type();
  if (trace::on()) {  // an instant where the failure is observed: the failed actor as detail
    trace::instant(trace::Category::kSupervision, trace::intern_cached("actor failed"), trace::now_ns(), 0,
                   trace::intern(message.child()));
  }
  failure_observers_.notify(peer, event);
  deliver_failure(message.parent(), std::move(event));
}

}  // namespace castmesh::proc
