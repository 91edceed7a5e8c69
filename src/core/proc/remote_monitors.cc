#include "core/proc/remote_monitors.h"

#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/detail/runtime_transport.h"
#include "castmesh/runtime.h"
#include "castmesh/wire/v1/control.pb.h"
#include "core/log/log.h"
#include "core/proc/proc_host.h"
#include "core/wire/status_code.h"

namespace castmesh::proc {

namespace v1 = wire::v1;
using Seam = detail::RuntimeTransportSeam;

RemoteMonitors::RemoteMonitors(ProcHost& host) : host_(&host), runtime_(host.runtime()), id_(host.id()) {
  // Raw `this`: the handlers live in the host, which owns this service and
  // stops its I/O thread before it goes.
  host.on_control(v1::Monitor().GetTypeName(), [this](const ProcId& peer, uint64_t, const std::string& payload) {
    handle_monitor(peer, payload);
  });
  host.on_control(v1::ActorDown().GetTypeName(), [this](const ProcId& peer, uint64_t, const std::string& payload) {
    handle_actor_down(peer, payload);
  });
}

void RemoteMonitors::detach() {
  detail::WriterMutexLock lock(host_mu_);
  host_ = nullptr;
}

void RemoteMonitors::watch(const Address& actor) {
  v1::Monitor monitor;
  monitor.set_actor(actor.to_string());
  {
    detail::MutexLock lock(mu_);
    monitor.set_monitor_id(next_monitor_id_++);
    monitors_sent_[actor] = monitor.monitor_id();
  }
  absl::Status sent;
  std::string who;
  {
    detail::ReaderMutexLock lock(host_mu_);
    if (host_ == nullptr) {
      sent = absl::UnavailableError("this proc's transport is shut down");
      who = actor.proc;
    } else {
      sent = host_->send_control(actor.proc, monitor);
      if (!sent.ok()) who = host_->describe(actor.proc);
    }
  }
  if (sent.ok()) return;
  {
    detail::MutexLock lock(mu_);
    auto it = monitors_sent_.find(actor);
    if (it == monitors_sent_.end() || it->second != monitor.monitor_id()) return;  // answered meanwhile
    monitors_sent_.erase(it);
  }
  Seam::report_remote_down(runtime_, actor,
                           absl::UnavailableError(absl::StrCat("cannot monitor ", actor.to_string(),
                                                               ": cannot send to proc ", who, ": ", sent.message())));
}

void RemoteMonitors::forget_peer(const ProcId& peer) {
  detail::MutexLock lock(mu_);
  monitors_served_.erase(peer);  // nobody left to tell
  absl::erase_if(monitors_sent_, [&peer](const auto& entry) { return entry.first.proc == peer; });
}

void RemoteMonitors::handle_actor_down(const ProcId& peer, const std::string& payload) {
  v1::ActorDown message;
  absl::StatusOr<Address> actor = absl::InvalidArgumentError("malformed ActorDown");
  if (message.ParseFromString(payload)) actor = Address::parse(message.actor());
  if (!actor.ok()) {
    CASTMESH_LOG_WARN("castmesh-proc {}: ignoring bad ActorDown from {} (actor '{}')", id_, peer,
                      log::printable(message.actor()));
    return;
  }
  {
    detail::MutexLock lock(mu_);
    auto it = monitors_sent_.find(*actor);
    // Only the answer to the latest Monitor sent for this actor counts (an
    // older one may be about an earlier actor at the same address).
    if (it == monitors_sent_.end() || it->second != message.monitor_id()) return;
    monitors_sent_.erase(it);
  }
  CASTMESH_LOG_DEBUG("castmesh-proc {}: monitored actor {} is down ({})", id_, log::printable(message.actor()),
                     message.reason_code() == 0 ? std::string("stopped") : log::printable(message.reason_message()));
  Seam::report_remote_down(runtime_, *actor, wire::status_from_wire(message.reason_code(), message.reason_message()),
                           message.message_type());
}

void RemoteMonitors::handle_monitor(const ProcId& peer, const std::string& payload) {
  v1::Monitor message;
  if (!message.ParseFromString(payload)) {
    CASTMESH_LOG_WARN("castmesh-proc {}: malformed Monitor from {}", id_, peer);
    return;
  }
  auto actor = Address::parse(message.actor());
  absl::Status refused;
  if (!actor.ok()) {
    refused =
        absl::InvalidArgumentError(absl::StrCat("cannot monitor '", message.actor(), "': ", actor.status().message()));
  } else if (actor->proc != id_) {
    refused = absl::InvalidArgumentError(
        absl::StrCat("cannot monitor ", message.actor(), ": proc ", id_, " does not host it"));
  }
  if (!refused.ok()) {
    v1::ActorDown down;
    down.set_actor(message.actor());
    down.set_monitor_id(message.monitor_id());
    down.set_reason_code(static_cast<int>(refused.code()));
    down.set_reason_message(std::string(refused.message()));
    detail::ReaderMutexLock lock(host_mu_);
    if (host_ != nullptr) (void)host_->send_control(peer, down);
    return;
  }
  bool first;
  {
    detail::MutexLock lock(mu_);
    auto [it, inserted] = monitors_served_[peer].insert_or_assign(message.actor(), message.monitor_id());
    first = inserted;
  }
  if (!first) return;  // already watched for this peer; the answer carries the latest id
  // Through this service, which detaches from the host: the runtime's actors
  // (and their watchers) may outlive the host.
  runtime_.monitor(runtime_.resolve(*actor),
                   [self = shared_from_this(), peer, name = message.actor()](const DownEvent& event) {
                     self->on_watched_actor_down(peer, name, event);
                   });
}

void RemoteMonitors::on_watched_actor_down(const ProcId& peer, const std::string& actor, const DownEvent& event) {
  detail::ReaderMutexLock host_lock(host_mu_);
  if (host_ == nullptr) return;
  v1::ActorDown down;
  {
    detail::MutexLock lock(mu_);
    auto by_peer = monitors_served_.find(peer);
    if (by_peer == monitors_served_.end()) return;  // that peer is gone
    auto it = by_peer->second.find(actor);
    if (it == by_peer->second.end()) return;
    down.set_monitor_id(it->second);
    by_peer->second.erase(it);
    if (by_peer->second.empty()) monitors_served_.erase(by_peer);
  }
  down.set_actor(actor);
  down.set_reason_code(static_cast<int>(event.reason.code()));
  down.set_reason_message(std::string(event.reason.message()));
  down.set_message_type(event.message_type);
  if (absl::Status st = host_->send_control(peer, down); !st.ok()) {
    CASTMESH_LOG_DEBUG("castmesh-proc {}: cannot report the stop of {} to {}: {}", id_, actor, peer, st.ToString());
  }
}

}  // namespace castmesh::proc
