#include "core/proc/proc_host.h"


#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/detail/runtime_transport.h"
#include "castmesh/wire/v1/control.pb.h"
#include "castmesh/wire/v1/metrics.pb.h"
#include "core/log/log.h"
#include "core/metrics/counters.h"
#include "core/platform/process_memory.h"
#include "core/proc/join.h"
#include "core/proc/remote_monitors.h"
#include "core/proc/remote_supervision.h"
#include "core/proc/spawn_service.h"
#include "core/transport/address.h"
#include "core/transport/unix_socket_names.h"
#include "core/trace/recorder.h"
#include "core/wire/status_code.h"

namespace castmesh::proc {
namespace {

namespace v1 = wire::v1;
using Seam = detail::RuntimeTransportSeam;

// Hosts by runtime, so a second allocation on one runtime reuses its host.
struct HostDirectory {
  detail::Mutex mu;
  absl::flat_hash_map<const Runtime*, std::weak_ptr<ProcHost>> by_runtime ABSL_GUARDED_BY(mu);
};
HostDirectory& host_directory() {
  static auto* directory = new HostDirectory;
  return *directory;
}

}  // namespace

// The RemoteRouter installed in the runtime. It outlives nothing: the host
// detaches it (under the exclusive lock) before the endpoint goes away, and
// a route() racing with that fails its request instead of touching a dead
// endpoint.
namespace {

// Traces (core/trace/recorder.h): a frame sent while a trace records carries
// a flow id; the send is a slice (named by the message type, the peer as
// detail, the payload's bytes as value) holding the arrow's start. The
// receiver ends the arrow at the handler of the actor message the frame
// caused (the envelope takes the inbound flow), or else at a "receive" slice
// on the thread that handled the frame.
void trace_sent(std::string_view type, const ProcId& peer, uint64_t flow, int64_t start_ns, size_t bytes) {
  const uint32_t name = trace::intern_cached(type);
  trace::flow(trace::Category::kSend, trace::RecordKind::kFlowOut, name, flow, start_ns);
  trace::slice(trace::Category::kSend, name, start_ns, trace::now_ns(), bytes, trace::intern_cached(peer));
}

// Runs `handle` with the frame's flow as the thread's inbound flow; ends the
// arrow here if nothing took it.
template <typename Handle>
void handle_traced(const v1::FrameHeader& frame_header, size_t bytes, Handle&& handle) {
  const uint64_t flow = frame_header.trace_flow();
  if (flow == 0 || !trace::on()) {
    handle();
    return;
  }
  const int64_t start_ns = trace::now_ns();
  trace::set_inbound_flow(flow);
  handle();
  if (trace::take_inbound_flow() != 0) {
    const uint32_t name = trace::intern_cached(frame_header.message_type());
    trace::flow(trace::Category::kSend, trace::RecordKind::kFlowIn, name, flow, start_ns);
    trace::slice(trace::Category::kReceive, name, start_ns, trace::now_ns(), bytes);
  }
}

}  // namespace

class ProcHost::Router : public detail::RemoteRouter {
 public:
  Router(ProcHost* host, Runtime* runtime) : host_(host), runtime_(runtime) {}

  void detach() {
    detail::WriterMutexLock lock(mu_);
    host_ = nullptr;
  }

  void route(detail::WireMessage msg) override {
    detail::ReaderMutexLock lock(mu_);
    if (host_ == nullptr) {
      lock.unlock();
      fail(msg, absl::UnavailableError("this proc's transport is shut down"));
      return;
    }
    v1::FrameHeader frame_header;
    frame_header.set_kind(v1::FrameHeader::KIND_MESSAGE);
    frame_header.set_destination(msg.destination.to_string());
    frame_header.set_port(msg.port);
    if (!msg.sender.empty()) frame_header.set_source(msg.sender.to_string());
    frame_header.set_message_type(msg.type_name);
    if (msg.reply_to) frame_header.set_reply_to(msg.reply_to->to_string());
    if (!msg.error.ok()) {
      wire::status_to_wire(msg.error, &frame_header);
    }
    ProcHost* host = host_;
    const ProcId& peer = msg.destination.proc;
    // While a trace records: a "send" slice with the start of an arrow that
    // ends where the receiving proc handles the message.
    const int64_t trace_start_ns = trace::on() ? trace::now_ns() : 0;
    uint64_t trace_flow = 0;
    if (trace_start_ns != 0) {
      trace_flow = trace::new_flow_id();
      frame_header.set_trace_flow(trace_flow);
    }
    const size_t payload_bytes = msg.payload.size();
    absl::Status sent =
        host->endpoint_->send(peer, std::move(frame_header), wire::Payload::adopt(std::move(msg.payload)));
    if (trace_start_ns != 0) trace_sent(msg.type_name, peer, trace_flow, trace_start_ns, payload_bytes);
    if (sent.ok()) {
      host->messages_sent_.fetch_add(1, std::memory_order_relaxed);
      metrics::transport(metrics::transport_of(peer)).out(payload_bytes);
    }
    if (!sent.ok()) {
      const std::string who = host->describe(peer);
      lock.unlock();
      fail(msg, absl::UnavailableError(absl::StrCat("cannot send to proc ", who, ": ", sent.message())));
    }
  }

  void watch(const Address& actor) override {
    detail::ReaderMutexLock lock(mu_);
    if (host_ == nullptr) {
      lock.unlock();
      Seam::report_remote_down(*runtime_, actor,
                               absl::UnavailableError(absl::StrCat("cannot monitor ", actor.to_string(),
                                                                   ": this proc's transport is shut down")));
      return;
    }
    host_->monitors_->watch(actor);
  }

 private:
  void fail(const detail::WireMessage& msg, absl::Status error) {
    if (msg.port == 0 && msg.reply_to) {
      // The reply port lives on this proc: the request fails now.
      Seam::fail_reply_port(*runtime_, *msg.reply_to, std::move(error));
    } else {
      CASTMESH_LOG_WARN("dropping message to {}: {}", msg.destination.to_string(), error.ToString());
    }
  }

  detail::SharedMutex mu_;
  ProcHost* host_ ABSL_GUARDED_BY(mu_);
  Runtime* runtime_;  // the runtime this router is installed in (it outlives its router's use)
};

struct ProcHost::PendingRequest {
  ProcId peer;
  detail::Mutex mu;
  detail::CondVar cv;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::StatusOr<std::string> result ABSL_GUARDED_BY(mu) = absl::UnknownError("no reply");

  void complete(absl::StatusOr<std::string> value) {
    {
      detail::MutexLock lock(mu);
      if (done) return;
      done = true;
      result = std::move(value);
    }
    cv.notify_all();
  }
};

absl::StatusOr<std::shared_ptr<ProcHost>> ProcHost::attach(Runtime& runtime, ProcHostOptions options) {
  {
    detail::MutexLock lock(host_directory().mu);
    auto it = host_directory().by_runtime.find(&runtime);
    if (it != host_directory().by_runtime.end() && !it->second.expired()) {
      return absl::AlreadyExistsError("this runtime is already a proc (ProcHost attached)");
    }
  }
  std::shared_ptr<ProcHost> host(new ProcHost(runtime, options.secret));
  transport::EndpointOptions endpoint_options;
  if (options.listen.empty()) {
    absl::StatusOr<std::string> unix_address = transport::unique_unix_listen_address();
    if (!unix_address.ok()) return unix_address.status();
    options.listen = *std::move(unix_address);
  }
  endpoint_options.listen = options.listen;
  endpoint_options.advertise_host = options.advertise_host;
  endpoint_options.secret = options.secret;
  endpoint_options.heartbeat_interval = options.heartbeat_interval;
  endpoint_options.heartbeat_timeout = options.heartbeat_timeout;
  endpoint_options.tls = options.tls;
  host->uses_tls_ = options.tls.enabled();
  ProcHost* raw = host.get();
  auto endpoint = transport::Endpoint::start(
      endpoint_options,
      [raw](const std::string& peer, wire::v1::FrameHeader&& frame_header, wire::Payload payload) {
        raw->on_message(peer, std::move(frame_header), std::move(payload));
      },
      [raw](const std::string& peer, const absl::Status& why) { raw->on_peer_lost(peer, why); },
      transport::DataHandlers{
          [raw](const std::string& peer, std::string_view type, std::string_view header, wire::Payload payload) {
            raw->deliver_data(peer, type, header, std::move(payload));
          },
          [raw](const std::string& peer, std::string_view type, std::string_view header, uint64_t size) {
            return raw->payload_sink(peer, type, header, size);
          }});
  if (!endpoint.ok()) return endpoint.status();
  host->endpoint_ = std::move(*endpoint);
  host->id_ = host->endpoint_->id();
  platform::note_this_proc_address(host->id_);
  if (absl::Status st = runtime.set_proc_id(host->endpoint_->id()); !st.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot make this runtime a proc: ", st.message(),
        " (allocate procs before spawning actors on the controller's runtime)"));
  }
  // The router's watches go to the monitors service: it exists first.
  host->monitors_ = std::make_shared<RemoteMonitors>(*host);
  host->router_ = std::make_shared<Router>(raw, &runtime);
  Seam::set_remote_router(runtime, host->router_);
  refuse_joins(*host);  // until an allocation waits for procs (core/proc/join.h)
  host->install_services();
  {
    detail::MutexLock lock(host_directory().mu);
    host_directory().by_runtime[&runtime] = host;
  }
  host->ready_.store(true, std::memory_order_release);
  CASTMESH_LOG_DEBUG("castmesh-proc {}: proc up (pid {})", host->id(), ::getpid());
  return host;
}

void ProcHost::install_services() {
  supervision_ = std::make_shared<RemoteSupervision>(*this);
  services_.emplace_back(kSupervisionService, supervision_);
  services_.emplace_back(kSpawnService, std::make_shared<SpawnService>(*this, *supervision_));
  services_.emplace_back(kMonitorsService, monitors_);
  for (auto& [name, install] : registered_proc_services()) {
    if (std::shared_ptr<ProcService> service = install(*this)) services_.emplace_back(name, std::move(service));
  }
}

std::shared_ptr<ProcHost> ProcHost::of(const Runtime& runtime) {
  detail::MutexLock lock(host_directory().mu);
  auto it = host_directory().by_runtime.find(&runtime);
  return it == host_directory().by_runtime.end() ? nullptr : it->second.lock();
}

ProcHost::~ProcHost() {
  {
    detail::MutexLock lock(host_directory().mu);
    auto it = host_directory().by_runtime.find(&runtime_);
    if (it != host_directory().by_runtime.end() && it->second.expired()) host_directory().by_runtime.erase(it);
  }
  ready_.store(false, std::memory_order_release);  // handlers starting now do nothing
  // Their pending requests fail; they send nothing more.
  for (auto& [name, service] : services_) service->detach();
  if (router_) {
    router_->detach();
    Seam::set_remote_router(runtime_, nullptr);
  }
  // Joins the I/O thread; a handler still running meanwhile may call
  // endpoint_->send(), which then fails cleanly (the object stays alive).
  if (endpoint_) endpoint_->shutdown();
  detail::MutexLock lock(mu_);
  for (auto& [id, pending] : pending_) pending->complete(absl::CancelledError("proc shut down"));
}

absl::Status ProcHost::send_control(const ProcId& peer, const google::protobuf::MessageLite& message,
                                    uint64_t correlation, bool is_reply) {
  v1::FrameHeader frame_header;
  frame_header.set_kind(v1::FrameHeader::KIND_CONTROL);
  frame_header.set_message_type(message.GetTypeName());
  frame_header.set_correlation(correlation);
  if (is_reply) frame_header.set_flags(wire::kControlReplyFlag);
  const int64_t trace_start_ns = trace::on() ? trace::now_ns() : 0;
  const uint64_t trace_flow = trace_start_ns != 0 ? trace::new_flow_id() : 0;
  if (trace_flow != 0) frame_header.set_trace_flow(trace_flow);
  std::string payload = message.SerializeAsString();
  const size_t payload_bytes = payload.size();
  absl::Status sent = endpoint_->send(peer, std::move(frame_header), wire::Payload::adopt(std::move(payload)));
  if (sent.ok()) {
    messages_sent_.fetch_add(1, std::memory_order_relaxed);
    metrics::transport(metrics::transport_of(peer)).out(payload_bytes);
  }
  if (sent.ok() && trace_flow != 0) trace_sent(message.GetTypeName(), peer, trace_flow, trace_start_ns, payload_bytes);
  return sent;
}

absl::StatusOr<std::string> ProcHost::request(const ProcId& peer, const google::protobuf::MessageLite& message,
                                              absl::Duration timeout) {
  auto pending = std::make_shared<PendingRequest>();
  pending->peer = peer;
  uint64_t id;
  {
    detail::MutexLock lock(mu_);
    id = next_id_++;
    pending_.emplace(id, pending);
  }
  absl::Status sent = send_control(peer, message, id);
  if (!sent.ok()) pending->complete(sent);
  {
    detail::MutexLock lock(pending->mu);
    if (!pending->cv.wait_for(lock, timeout, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pending->mu) { return pending->done; })) {
      pending->done = true;
      pending->result = absl::DeadlineExceededError(absl::StrCat("no answer from proc ", describe(peer), " within ",
                                                                 absl::FormatDuration(timeout)));
    }
  }
  {
    detail::MutexLock lock(mu_);
    pending_.erase(id);
  }
  detail::MutexLock lock(pending->mu);
  return pending->result;
}

absl::Status ProcHost::send_data(const ProcId& peer, std::string_view type_name, std::string_view header,
                                 wire::Payload payload) {
  // Data messages are latency-bound (a collective step, an RDMA handshake):
  // a small one is written by this thread when the connection is idle.
  const size_t bytes = header.size() + payload.size();
  absl::Status sent =
      endpoint_->send_data(peer, type_name, header, std::move(payload), transport::SendUrgency::kNow);
  if (sent.ok()) {
    messages_sent_.fetch_add(1, std::memory_order_relaxed);
    metrics::transport(metrics::transport_of(peer)).out(bytes);
  }
  return sent;
}

void ProcHost::on_data(const std::string& type_name, DataHandler handler) {
  if (ready_.load(std::memory_order_acquire)) {
    CASTMESH_LOG_ERROR("castmesh-proc {}: a data handler for '{}' registered after the proc is up is ignored", id(),
                       type_name);
    return;
  }
  data_handlers_[type_name] = std::move(handler);
}

void ProcHost::on_data_sink(const std::string& type_name, DataSinkProvider provider) {
  if (ready_.load(std::memory_order_acquire)) {
    CASTMESH_LOG_ERROR("castmesh-proc {}: a payload sink for '{}' registered after the proc is up is ignored", id(),
                       type_name);
    return;
  }
  data_sinks_[type_name] = std::move(provider);
}

std::shared_ptr<transport::PayloadSink> ProcHost::payload_sink(const std::string& peer, std::string_view type_name,
                                                               std::string_view header, uint64_t size) {
  if (!ready_.load(std::memory_order_acquire)) return nullptr;  // after it, the table is read-only
  // An observer's data message goes to deliver_data, which refuses it.
  if (observer_count_.load(std::memory_order_relaxed) != 0 && is_observer(peer)) return nullptr;
  auto it = data_sinks_.find(absl::string_view(type_name.data(), type_name.size()));
  if (it == data_sinks_.end()) return nullptr;
  std::shared_ptr<transport::PayloadSink> sink = it->second(peer, header, size);
  // A message received into a sink skips deliver_data, which counts the others.
  if (sink != nullptr) metrics::transport(metrics::transport_of(peer)).in(header.size() + size);
  return sink;
}

std::shared_ptr<ProcService> ProcHost::service(const std::string& name) const {
  for (const auto& [service_name, service] : services_) {
    if (service_name == name) return service;
  }
  return nullptr;
}

void ProcHost::on_control(const std::string& type_name, ControlHandler handler) {
  detail::MutexLock lock(mu_);
  control_handlers_[type_name] = std::move(handler);
}

uint64_t ProcHost::add_peer_lost_observer(PeerLostObserver observer) {
  return peer_lost_observers_.add(std::move(observer));
}

void ProcHost::remove_peer_lost_observer(uint64_t id) { peer_lost_observers_.remove(id); }

void ProcHost::describe_peer(const ProcId& peer, std::string description) {
  detail::MutexLock lock(mu_);
  descriptions_[peer] = std::move(description);
}

std::string ProcHost::describe(const ProcId& peer) const {
  detail::MutexLock lock(mu_);
  auto it = descriptions_.find(peer);
  return it == descriptions_.end() ? peer : absl::StrCat(peer, " (", it->second, ")");
}

void ProcHost::on_message(const std::string& peer, wire::v1::FrameHeader&& frame_header, wire::Payload payload) {
  if (!ready_.load(std::memory_order_acquire)) return;
  metrics::transport(metrics::transport_of(peer)).in(payload.size());
  if (observer_count_.load(std::memory_order_relaxed) != 0 && refuse_from_observer(peer, frame_header)) return;
  if (frame_header.kind() == v1::FrameHeader::KIND_CONTROL) {
    if (frame_header.flags() & wire::kControlReplyFlag) {
      std::shared_ptr<PendingRequest> pending;
      {
        detail::MutexLock lock(mu_);
        auto it = pending_.find(frame_header.correlation());
        if (it != pending_.end()) pending = it->second;
      }
      handle_traced(frame_header, payload.size(), [&] {
        if (!pending) return;
        // A request the peer refused as a whole (an observer's, above).
        if (frame_header.error_code() != 0) {
          pending->complete(wire::status_from_wire(frame_header));
        } else {
          pending->complete(std::string(payload.view()));
        }
      });
      return;
    }
    if (frame_header.message_type() == v1::ObserverAttach().GetTypeName()) {
      on_observer_attach(peer, frame_header.correlation(), payload.view());
      return;
    }
    ControlHandler handler;
    {
      detail::MutexLock lock(mu_);
      auto it = control_handlers_.find(frame_header.message_type());
      if (it != control_handlers_.end()) handler = it->second;
    }
    if (handler) {
      handle_traced(frame_header, payload.size(),
                    [&] { handler(peer, frame_header.correlation(), std::string(payload.view())); });
    } else {
      CASTMESH_LOG_WARN("castmesh-proc {}: unknown control message '{}' from {}", id(), frame_header.message_type(),
                        peer);
    }
    return;
  }
  auto destination = Address::parse(frame_header.destination());
  if (!destination.ok()) {
    CASTMESH_LOG_WARN("castmesh-proc {}: dropping message from {} with bad destination '{}'", id(), peer,
                      frame_header.destination());
    return;
  }
  absl::Status delivered;
  if (frame_header.port() == 0) {
    std::optional<PortAddress> reply_to;
    if (!frame_header.reply_to().empty()) {
      auto port = PortAddress::parse(frame_header.reply_to());
      if (port.ok()) reply_to = std::move(*port);
    }
    Address sender;
    if (!frame_header.source().empty()) {
      if (auto s = Address::parse(frame_header.source()); s.ok()) sender = std::move(*s);
    }
    // A short-handler actor that is idle handles the message on this (I/O)
    // thread, unless more frames wait behind this one.
    const bool may_run_here = !transport::Endpoint::delivering_followed();
    // The envelope made in this call carries the sender's flow to its handler.
    handle_traced(frame_header, payload.size(), [&] {
      delivered = Seam::deliver_serialized(runtime_, *destination, frame_header.message_type(), payload.view(),
                                           reply_to, sender, may_run_here);
    });
  } else {
    const PortAddress port{*destination, frame_header.port()};
    if (frame_header.error_code() != 0) {
      Seam::fail_reply_port(runtime_, port, wire::status_from_wire(frame_header));
    } else {
      handle_traced(frame_header, payload.size(), [&] {
        delivered = Seam::deliver_serialized_reply(runtime_, port, frame_header.message_type(), payload.view());
      });
    }
  }
  if (!delivered.ok()) {
    CASTMESH_LOG_DEBUG("castmesh-proc {}: message from {} to {} not delivered: {}", id(), peer,
                       frame_header.destination(), delivered.ToString());
  }
}

void ProcHost::deliver_data(const std::string& peer, std::string_view type_name, std::string_view header,
                            wire::Payload payload) {
  if (!ready_.load(std::memory_order_acquire)) return;  // after it, the table is read-only
  metrics::transport(metrics::transport_of(peer)).in(header.size() + payload.size());
  if (observer_count_.load(std::memory_order_relaxed) != 0 && is_observer(peer)) {
    CASTMESH_LOG_WARN("castmesh-proc {}: refused data message '{}' from observer {}", id(), log::printable(type_name),
                      peer);
    return;
  }
  auto it = data_handlers_.find(absl::string_view(type_name.data(), type_name.size()));
  if (it != data_handlers_.end()) {
    it->second(peer, header, std::move(payload));
  } else {
    CASTMESH_LOG_WARN("castmesh-proc {}: unknown data message '{}' from {}", id(), log::printable(type_name), peer);
  }
}

void ProcHost::on_peer_lost(const std::string& peer, const absl::Status& why) {
  if (!ready_.load(std::memory_order_acquire)) return;
  const absl::Status gone = absl::UnavailableError(absl::StrCat("proc ", describe(peer), " is gone: ", why.message()));
  CASTMESH_LOG_DEBUG("castmesh-proc {}: {}", id(), std::string(gone.message()));
  if (trace::on()) {  // an instant where the loss is observed: the lost proc as detail
    trace::instant(trace::Category::kSupervision, trace::intern_cached("proc lost"), trace::now_ns(), 0,
                   trace::intern(describe(peer)));
  }
  monitors_->forget_peer(peer);  // before the runtime is told: a monitor started after that is kept
  Seam::report_proc_down(runtime_, peer, gone);  // every monitor of an actor there is down
  std::vector<std::shared_ptr<PendingRequest>> failed;
  {
    detail::MutexLock lock(mu_);
    for (auto& [id, pending] : pending_) {
      if (pending->peer == peer) failed.push_back(pending);
    }
  }
  for (auto& pending : failed) pending->complete(gone);
  {
    detail::MutexLock lock(mu_);
    if (observers_.erase(peer) != 0) observer_count_.fetch_sub(1, std::memory_order_relaxed);
  }
  peer_lost_observers_.notify(peer, gone);
}

// ---- the observer role (docs/security.md) ----

void ProcHost::allow_observers(const std::string& type_name) {
  detail::MutexLock lock(mu_);
  observer_requests_.insert(type_name);
}

bool ProcHost::is_observer(const ProcId& peer) const {
  detail::MutexLock lock(mu_);
  return observers_.contains(peer);
}

void ProcHost::on_observer_attach(const ProcId& peer, uint64_t correlation, std::string_view payload) {
  v1::ObserverAttach request;
  v1::ObserverReply reply;
  if (!request.ParseFromString(std::string(payload))) {
    wire::status_to_wire(absl::InvalidArgumentError("malformed ObserverAttach"), &reply);
  } else {
    {
      detail::MutexLock lock(mu_);
      if (observers_.insert(peer).second) observer_count_.fetch_add(1, std::memory_order_relaxed);
    }
    reply.set_label(id());
    CASTMESH_LOG_INFO("castmesh-proc {}: {} is attached as a read-only observer{}", id(), peer,
                      request.name().empty() ? std::string() : absl::StrCat(" (", request.name(), ")"));
  }
  (void)send_control(peer, reply, correlation, /*is_reply=*/true);
}

bool ProcHost::refuse_from_observer(const ProcId& peer, const wire::v1::FrameHeader& frame_header) {
  const bool control = frame_header.kind() == v1::FrameHeader::KIND_CONTROL;
  if (control && (frame_header.flags() & wire::kControlReplyFlag)) return false;  // answers to our requests
  {
    detail::MutexLock lock(mu_);
    if (!observers_.contains(peer)) return false;
    if (control && observer_requests_.contains(frame_header.message_type())) return false;
  }
  if (control && frame_header.message_type() == v1::ObserverAttach().GetTypeName()) return false;
  const absl::Status refused = absl::FailedPreconditionError(
      absl::StrCat("proc ", id(), " refuses ", control ? "control request " : "actor message ",
                   frame_header.message_type(), " from ", peer,
                   ": that connection is a read-only observer (it may read metrics and stack dumps; it may neither "
                   "spawn nor send to actors)"));
  CASTMESH_LOG_WARN("castmesh-proc {}: {}", id(), std::string(refused.message()));
  if (control) {
    if (frame_header.correlation() == 0) return true;  // a one-way message: nobody waits
    v1::FrameHeader reply;
    reply.set_kind(v1::FrameHeader::KIND_CONTROL);
    reply.set_message_type(frame_header.message_type());
    reply.set_correlation(frame_header.correlation());
    reply.set_flags(wire::kControlReplyFlag);
    wire::status_to_wire(refused, &reply);
    (void)endpoint_->send(peer, std::move(reply), wire::Payload());
    return true;
  }
  // An actor request: its answer port fails with the refusal.
  if (frame_header.port() == 0 && !frame_header.reply_to().empty()) {
    if (absl::StatusOr<PortAddress> port = PortAddress::parse(frame_header.reply_to()); port.ok()) {
      v1::FrameHeader answer;
      answer.set_kind(v1::FrameHeader::KIND_MESSAGE);
      answer.set_destination(port->owner.to_string());
      answer.set_port(port->port);
      answer.set_message_type(frame_header.message_type());
      wire::status_to_wire(refused, &answer);
      (void)endpoint_->send(peer, std::move(answer), wire::Payload());
    }
  }
  return true;
}

}  // namespace castmesh::proc
