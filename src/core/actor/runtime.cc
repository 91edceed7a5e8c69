#include "castmesh/runtime.h"

#include "castmesh/detail/runtime_transport.h"

#include "core/actor/runtime_core.h"

namespace castmesh {

Runtime::Runtime(RuntimeOptions options) : core_(std::make_unique<detail::RuntimeCore>(this, std::move(options))) {}

Runtime::~Runtime() { core_->shutdown(); }

UntypedRef Runtime::resolve(const Address& address) { return UntypedRef(core_->resolve(address)); }
void Runtime::shutdown() { core_->shutdown(); }
const ProcId& Runtime::proc_id() const { return core_->proc_id(); }
absl::Status Runtime::set_proc_id(ProcId id) { return core_->set_proc_id(std::move(id)); }
MonitorId Runtime::monitor(const UntypedRef& target, std::function<void(const DownEvent&)> on_down) {
  return core_->monitor(target, detail::Watcher{{}, std::move(on_down)});
}

bool Runtime::demonitor(const UntypedRef& target, MonitorId id) { return core_->demonitor(target, id); }

bool Runtime::cancel_timer(TimerId id) { return core_->timers().cancel(id); }
TimerId Runtime::add_timer(absl::Duration delay, absl::Duration period, std::function<void()> fire) {
  return core_->timers().add(delay, period, std::move(fire));
}

size_t Runtime::live_actors() const { return core_->live_actors(); }
int Runtime::worker_count() const { return core_->scheduler().worker_count(); }

Runtime* Runtime::current() {
  detail::RuntimeCore* rt = detail::RuntimeCore::current();
  return rt ? rt->owner : nullptr;
}

}  // namespace castmesh

namespace castmesh::detail {

void RuntimeTransportSeam::set_remote_router(Runtime& runtime, std::shared_ptr<RemoteRouter> router) {
  runtime.core_->set_router(std::move(router));
}

absl::Status RuntimeTransportSeam::deliver_wire(Runtime& runtime, WireMessage msg) {
  RuntimeCore& core = *runtime.core_;
  if (msg.port != 0) {
    const PortAddress port{msg.destination, msg.port};
    if (!msg.error.ok()) {
      core.fail_reply_port(port, std::move(msg.error));
      return absl::OkStatus();
    }
    return core.deliver_serialized_reply(port, msg.type_name, msg.payload);
  }
  return core.deliver_serialized(msg.destination, msg.type_name, msg.payload, msg.reply_to, msg.sender);
}

absl::Status RuntimeTransportSeam::deliver_serialized(Runtime& runtime, const Address& destination,
                                                      std::string_view type_name, std::string_view bytes,
                                                      const std::optional<PortAddress>& reply_to,
                                                      const Address& sender, bool may_run_here) {
  return runtime.core_->deliver_serialized(destination, type_name, bytes, reply_to, sender, may_run_here);
}

absl::Status RuntimeTransportSeam::deliver_serialized_reply(Runtime& runtime, const PortAddress& port,
                                                            std::string_view type_name, std::string_view bytes) {
  return runtime.core_->deliver_serialized_reply(port, type_name, bytes);
}

void RuntimeTransportSeam::fail_reply_port(Runtime& runtime, const PortAddress& port, absl::Status error) {
  runtime.core_->fail_reply_port(port, std::move(error));
}

void RuntimeTransportSeam::fail_pending_to_proc(Runtime& runtime, const ProcId& proc, absl::Status error) {
  runtime.core_->fail_pending_to_proc(proc, error);
}

void RuntimeTransportSeam::report_remote_down(Runtime& runtime, const Address& actor, absl::Status reason,
                                              std::string message_type) {
  runtime.core_->report_remote_down(actor, reason, std::move(message_type));
}

void RuntimeTransportSeam::report_proc_down(Runtime& runtime, const ProcId& proc, absl::Status reason) {
  runtime.core_->report_proc_down(proc, reason);
}

absl::Status RuntimeTransportSeam::deliver_supervision_event(Runtime& runtime, const Address& parent,
                                                             SupervisionEvent event) {
  auto cell = runtime.core_->find_local(parent);
  if (!cell) return absl::NotFoundError("no actor " + parent.to_string());
  auto* env = new TypedEnvelope<SupervisionEvent>(std::move(event));
  env->kind = EnvelopeKind::kSupervision;
  env->type_id = type_id<SupervisionEvent>();
  if (!cell->mailbox_push_system(env)) return absl::UnavailableError("actor " + parent.to_string() + " stopped");
  return absl::OkStatus();
}

}  // namespace castmesh::detail
