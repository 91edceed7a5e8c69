// ProcHost: makes one Runtime a proc of a mesh, and is the composition root
// of the proc's services. It owns the proc's transport Endpoint, installs
// itself as the Runtime's RemoteRouter (actor messages to other procs
// become Envelopes and back), reports dead peers to the Runtime (pending
// requests fail, monitors fire), dispatches control messages by type to
// the services' handlers, correlates requests with their replies, carries
// data messages, and tells peer-lost observers.
//
// Services (core/proc/proc_service.h): ProcHost::attach installs the proc's
// own ones (RemoteSupervision, SpawnService, RemoteMonitors; it wires the
// router's watches and lost peers to RemoteMonitors) and then every
// registered one (the cast relay, collectives, RDMA). docs/architecture.md
// says how a service is added.
//
// Threading: public methods are thread-safe. Control handlers and peer-lost
// observers run on the endpoint's I/O thread and must not block; request()
// blocks its caller and must not be called on that thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/runtime.h"
#include "core/proc/observer_registry.h"
#include "core/proc/proc_service.h"
#include "core/transport/endpoint.h"

namespace google::protobuf {
class MessageLite;
}

namespace castmesh::proc {

class RemoteMonitors;
class RemoteSupervision;

// Names of the services every ProcHost installs itself (ProcHost::service).
inline constexpr char kSupervisionService[] = "proc.supervision";
inline constexpr char kSpawnService[] = "proc.spawn";
inline constexpr char kMonitorsService[] = "proc.monitors";

// Environment variables between a LocalAllocator and its workers.
inline constexpr char kEnvBootstrap[] = "CASTMESH_BOOTSTRAP";  // controller's proc id
inline constexpr char kEnvSecret[] = "CASTMESH_SECRET";
inline constexpr char kEnvRank[] = "CASTMESH_RANK";
inline constexpr char kEnvWorldSize[] = "CASTMESH_WORLD_SIZE";
inline constexpr char kEnvTransport[] = "CASTMESH_TRANSPORT";  // "unix" | "tcp"
inline constexpr char kEnvParentPid[] = "CASTMESH_PARENT_PID";
// Set by the user for procs started by a launcher (mpirun, srun, a
// Kubernetes Job): the controller's rendezvous address (core/proc/launch_env.h).
inline constexpr char kEnvRendezvous[] = "CASTMESH_RENDEZVOUS";
inline constexpr char kEnvAdvertiseHost[] = "CASTMESH_ADVERTISE_HOST";
inline constexpr char kEnvJoinTimeout[] = "CASTMESH_JOIN_TIMEOUT";  // seconds

struct ProcHostOptions {
  std::string listen;  // channel URL; empty: a fresh Unix address (unique_unix_listen_address)
  std::string advertise_host;  // tcp: host of the proc id for a wildcard listen (EndpointOptions)
  std::string secret;
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  transport::TlsFiles tls;  // mutual TLS on TCP connections (EndpointOptions::tls); empty: none
};

class ProcHost : public std::enable_shared_from_this<ProcHost> {
 public:
  using ControlHandler = std::function<void(const ProcId& peer, uint64_t correlation, const std::string& payload)>;
  using PeerLostObserver = std::function<void(const ProcId& peer, const absl::Status& why)>;
  // Receives a data message (send_data) on the I/O thread, or on a
  // transport::PeerReader's thread for the types its filter accepts: the
  // sender's header bytes and the raw body (shared, not copied; borrowed
  // when a reader delivers it, so owned() to keep it). Must not block.
  using DataHandler = std::function<void(const ProcId& peer, std::string_view header, wire::Payload payload)>;
  // Asked on the I/O thread for a data message whose payload (`size` bytes)
  // has not arrived yet: a sink that receives it in place (e.g. straight
  // into a user's buffer), or nullptr for the DataHandler path. A message
  // given a sink does not reach the DataHandler. Must not block.
  using DataSinkProvider = std::function<std::shared_ptr<transport::PayloadSink>(
      const ProcId& peer, std::string_view header, uint64_t size)>;

  // Starts the endpoint, sets runtime's proc id to its address, installs
  // the router and the services. The runtime must outlive the host; one
  // host per runtime.
  static absl::StatusOr<std::shared_ptr<ProcHost>> attach(Runtime& runtime, ProcHostOptions options);
  // The host attached to `runtime`, or nullptr.
  static std::shared_ptr<ProcHost> of(const Runtime& runtime);
  // Detaches every service, uninstalls the router and closes every connection.
  ~ProcHost();

  // This proc's id: its endpoint's address.
  const ProcId& id() const { return id_; }
  // The runtime this host made a proc.
  Runtime& runtime() const { return runtime_; }
  // The mesh's shared secret (authenticates every connection).
  const std::string& secret() const { return secret_; }
  // Whether this proc's TCP connections use mutual TLS.
  bool uses_tls() const { return uses_tls_; }

  // One-way control message (FrameHeader.kind = KIND_CONTROL).
  absl::Status send_control(const ProcId& peer, const google::protobuf::MessageLite& message,
                            uint64_t correlation = 0, bool is_reply = false);
  // Sends a control request and waits for the reply's payload; fails when
  // `peer` is lost first or after `timeout`.
  absl::StatusOr<std::string> request(const ProcId& peer, const google::protobuf::MessageLite& message,
                                      absl::Duration timeout);
  // Handles incoming control messages of one type (full protobuf name).
  void on_control(const std::string& type_name, ControlHandler handler);
  // One-way data message: a small `header` (the service's serialized
  // protobuf, at most a few KiB) and `payload`, the raw body, which leaves
  // from its own buffer (Payload::share sends user memory without a copy).
  // A small one finding the connection idle is written by the calling
  // thread at once (transport::SendUrgency::kNow).
  absl::Status send_data(const ProcId& peer, std::string_view type_name, std::string_view header,
                         wire::Payload payload = {});
  // Handles incoming data messages of one type (see send_data). Only while
  // the host installs its services (a service's constructor): once the
  // proc is up, every frame reads these tables without a lock, and a later
  // call is refused with an error line.
  void on_data(const std::string& type_name, DataHandler handler);
  // Offers sinks for the payloads of one data message type (see
  // DataSinkProvider); when on_data may be called.
  void on_data_sink(const std::string& type_name, DataSinkProvider provider);
  // The service installed as `name` on this host, or nullptr: a registered
  // one (core/proc/proc_service.h) or the proc's own (kSupervisionService,
  // kSpawnService, kMonitorsService).
  std::shared_ptr<ProcService> service(const std::string& name) const;
  // Called (I/O thread) for every lost peer, after the runtime was told.
  uint64_t add_peer_lost_observer(PeerLostObserver observer);
  void remove_peer_lost_observer(uint64_t id);
  // Gives the connection to `peer` its own heartbeat (a HostMesh's hosts
  // and procs; transport::Endpoint::set_peer_heartbeat). Any thread.
  void set_peer_heartbeat(const ProcId& peer, absl::Duration interval, absl::Duration timeout) {
    endpoint_->set_peer_heartbeat(peer, transport::HeartbeatSettings{interval, timeout});
  }
  // `peer`'s process id as the kernel tells it for their Unix-socket
  // connection, or nullopt (TCP, no connection now). Services that act on a
  // pid a peer sends (cross-memory copies) check it against this.
  std::optional<long> peer_pid(const ProcId& peer) const { return endpoint_->peer_pid(peer); }
  // The peers with an authenticated connection now (procs, agents, the
  // controller). Any thread.
  std::vector<ProcId> peers() const { return endpoint_->peers(); }
  // A human description used in errors about `peer` ("rank 2, pid 1234").
  void describe_peer(const ProcId& peer, std::string description);
  // `peer` with its description, if any, for error messages.
  std::string describe(const ProcId& peer) const;
  // The supervision tree across procs (core/proc/remote_supervision.h):
  // failures forwarded to spawners, delivered to parents or the root.
  RemoteSupervision& supervision() const { return *supervision_; }
  // Messages this proc sent to other procs (actor messages, answers and
  // control messages; not heartbeats). Statistics, e.g. the fan-out of casts.
  uint64_t messages_sent() const { return messages_sent_.load(std::memory_order_relaxed); }

  // Observers (docs/security.md): a peer that sent ObserverAttach
  // (metrics.proto) is a read-only observer until it goes; its actor
  // messages, data messages and control requests are refused with
  // FAILED_PRECONDITION, except the control types a service allowed here
  // (read-only requests: metrics, stack dumps). Any thread.
  void allow_observers(const std::string& type_name);
  // Whether `peer` attached as an observer. Any thread.
  bool is_observer(const ProcId& peer) const;

 private:
  class Router;
  struct PendingRequest;

  ProcHost(Runtime& runtime, std::string secret) : runtime_(runtime), secret_(std::move(secret)) {}
  void on_message(const std::string& peer, wire::v1::FrameHeader&& frame_header, wire::Payload payload);
  void on_peer_lost(const std::string& peer, const absl::Status& why);
  void deliver_data(const std::string& peer, std::string_view type_name, std::string_view header,
                    wire::Payload payload);
  std::shared_ptr<transport::PayloadSink> payload_sink(const std::string& peer, std::string_view type_name,
                                                       std::string_view header, uint64_t size);
  // Installs the proc's own services, then the registered ones.
  void install_services();
  void on_observer_attach(const ProcId& peer, uint64_t correlation, std::string_view payload);
  // True (and the refusal answered) when `frame_header` comes from an
  // observer and is not one of the requests it may make.
  bool refuse_from_observer(const ProcId& peer, const wire::v1::FrameHeader& frame_header);

  Runtime& runtime_;
  std::string secret_;
  bool uses_tls_ = false;  // set by attach(), before the host is shared
  std::unique_ptr<transport::Endpoint> endpoint_;  // set once in attach(), shut down (not reset) in the destructor
  ProcId id_;                                       // endpoint_->id(), copied so teardown never races on it
  std::shared_ptr<Router> router_;
  std::atomic<uint64_t> messages_sent_{0};
  // Set once attach() has finished wiring; the endpoint's handlers ignore
  // traffic before (nobody knows this proc's address yet anyway).
  std::atomic<bool> ready_{false};

  // Installed once in attach(), detached in the destructor; read-only between.
  std::vector<std::pair<std::string, std::shared_ptr<ProcService>>> services_;
  std::shared_ptr<RemoteSupervision> supervision_;  // also in services_
  std::shared_ptr<RemoteMonitors> monitors_;        // also in services_; the router's watches
  ObserverRegistry<ProcId, absl::Status> peer_lost_observers_;

  mutable detail::Mutex mu_;
  absl::flat_hash_map<std::string, ControlHandler> control_handlers_ ABSL_GUARDED_BY(mu_);
  // Filled while the services are installed, before ready_; read-only
  // (and read without mu_) once ready_ is set.
  absl::flat_hash_map<std::string, DataHandler> data_handlers_;
  absl::flat_hash_map<std::string, DataSinkProvider> data_sinks_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<PendingRequest>> pending_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ProcId, std::string> descriptions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_set<ProcId> observers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> observer_requests_ ABSL_GUARDED_BY(mu_);
  // observers_.size(), read without mu_ on every frame (zero: no lookup).
  std::atomic<size_t> observer_count_{0};
};

}  // namespace castmesh::proc
