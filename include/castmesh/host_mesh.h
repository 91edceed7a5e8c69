// Many hosts, one controller (docs/hosts.md).
//
//  * run_host_agent(options): serves as the host agent of this machine
//    (the `castmesh-host` executable, Python's run_worker_loop_forever): it
//    listens on TCP, serves one controller at a time, starts procs for it,
//    and kills them all when that controller disconnects or stops answering
//    heartbeats.
//  * HostMesh::attach(runtime, workers, options): a controller attaches to
//    the agents at `workers` and gets a HostMesh of one dimension "hosts".
//  * HostMesh::spawn_procs(per_host): a ProcMesh {hosts, per_host...}
//    across them; everything a local ProcMesh does works on it.
//
// Thread-safety is stated per type.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/time/time.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "castmesh/proc_mesh.h"
#include "castmesh/runtime.h"
#include "castmesh/shape.h"

namespace castmesh {

// The `ca` value that means "no TLS" (Monarch's default): connections are
// authenticated by the mesh secret only, in plaintext. Otherwise `ca`,
// `cert` and `private_key` are PEM files and every TCP connection between
// the controller, the agents and their procs is mutual TLS 1.3 with them,
// the secret still required inside it (docs/security.md).
inline constexpr char kTrustAllConnections[] = "trust_all_connections";

// The mesh secret of agents and their controllers: `explicit_secret` if not
// empty, else $CASTMESH_SECRET, else the contents of the file named by
// $CASTMESH_SECRET_FILE, which must be this user's with no group or other
// permissions (0600). Errors say how to fix it. Any thread.
absl::StatusOr<std::string> resolve_mesh_secret(const std::string& explicit_secret);

// How a host agent runs. Plain value.
struct HostAgentOptions {
  // Where to listen: "tcp://HOST:PORT" (Monarch's form) or "tcp:HOST:PORT";
  // HOST 0.0.0.0 or [::] listens on every interface and advertises this
  // machine's resolvable name (or first non-loopback address), or
  // "tcp://ADVERTISE@0.0.0.0:PORT" names what to advertise. Port 0: a free
  // port (read it from on_listening). The procs it starts listen on TCP at
  // the advertised host.
  std::string address;
  // The mesh secret every connection must prove. Empty: $CASTMESH_SECRET,
  // else the file named by $CASTMESH_SECRET_FILE (which must be mode 0600
  // and owned by this user); an agent never runs without one.
  std::string secret;
  // Mutual TLS: the CA file, this agent's certificate and its private key
  // (mode 0600), or the defaults (no TLS). The agent's procs use the same
  // files, by path (CASTMESH_TLS_CA/_CERT/_KEY in their environment); a
  // file replaced on disk is used from the next connection on.
  std::string ca = kTrustAllConnections;
  std::string cert;
  std::string private_key;
  // This host's identity, given to every proc it starts
  // (CASTMESH_HOST_IDENTITY). Empty: boot id, pid and network namespace.
  std::string host_identity;
  // The worker command for a controller that sends none (Python
  // controllers ask for "the agent's Python worker"): e.g.
  // {"python3", "-m", "castmesh._worker"}. Empty: such a request fails.
  std::vector<std::string> worker_argv;
  // Called once the agent listens, with its address (e.g. "tcp:node1:26600").
  std::function<void(const std::string& address)> on_listening;
};

// Runs a host agent until a controller's HostMesh::shutdown() ends it
// (returns OK) or it cannot start (bad address, port taken, no secret: the
// reason). Blocks; any thread but a castmesh one. SIGINT/SIGTERM handling is
// the caller's (the castmesh-host executable exits on them).
absl::Status run_host_agent(HostAgentOptions options);

// How a controller attaches to host agents. Plain value.
struct HostMeshOptions {
  // The controller's name in the agents' messages (e.g. to a second
  // controller they refuse). Empty: its address.
  std::string name;
  // The mesh secret (as HostAgentOptions::secret; empty: the runtime's if
  // it is a proc already, else $CASTMESH_SECRET / $CASTMESH_SECRET_FILE).
  std::string secret;
  // Mutual TLS (as HostAgentOptions): the controller's listener, which the
  // agents' procs dial, uses it too.
  std::string ca = kTrustAllConnections;
  std::string cert;
  std::string private_key;
  // Heartbeat of every connection to these hosts' agents and procs (both
  // directions): a host that vanishes without a reset fails what is pending
  // on it within timeout + interval.
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // How long each agent has to answer the attach.
  absl::Duration attach_timeout = absl::Seconds(30);
  // Where this controller listens if `runtime` is not a proc yet. Empty:
  // every interface ("tcp:0.0.0.0:0"), advertising the local address of the
  // route to the first agent.
  std::string listen;
  // Failures of actors spawned on these hosts' procs by a plain thread.
  std::function<void(const SupervisionEvent&)> on_supervision_event;
};

// One attached host. Plain value.
struct HostInfo {
  std::string address;        // the agent's address as given to attach
  std::string agent;          // its proc id (the address it proves)
  std::string hostname;       // the agent's host name
  std::string host_identity;  // what its procs compare for "same host"
  int64_t agent_pid = 0;
};

// How HostMesh::spawn_procs starts procs. Plain value.
struct HostSpawnOptions {
  // Worker command. Empty: this program again (as LocalAllocator; the
  // binary must exist at the same path on every host).
  std::vector<std::string> worker_argv;
  // Ask each agent for its own Python worker (HostAgentOptions::worker_argv)
  // instead of worker_argv.
  bool agent_python_worker = false;
  // Extra environment of every proc.
  std::vector<std::pair<std::string, std::string>> worker_env;
  // Extra environment of one proc, from its point in the new mesh.
  std::function<std::vector<std::pair<std::string, std::string>>(const Point&)> env_for;
  // CPU binding: "" (none), "cores" (each proc of a host on one core, round
  // robin), or one CPU list per proc of a host, separated by ';' ("0-3;4-7").
  std::string proc_bind;
  absl::Duration join_timeout = absl::Seconds(60);
};

// A set of attached hosts addressed by a Shape (one dimension "hosts" as
// attached; slicing keeps the host ranks). Copies and slices share the
// attachment. Thread-safe; not on a castmesh I/O thread (methods block).
class HostMesh {
 public:
  HostMesh() = default;

  // Attaches to the agents at `workers` (each "tcp://HOST:PORT" or
  // "tcp:HOST:PORT"), all at once. Makes `runtime` a proc listening on TCP
  // if it is not one. Errors (one status naming every agent that failed):
  // unreachable, wrong secret, attached to another controller, no answer
  // within attach_timeout; the agents that did attach are let go.
  static absl::StatusOr<HostMesh> attach(Runtime& runtime, const std::vector<std::string>& workers,
                                         HostMeshOptions options = {});

  size_t size() const { return shape_.size(); }
  const Shape& shape() const { return shape_; }
  // The hosts of this view, in row-major order of shape().
  std::vector<HostInfo> hosts() const;
  // A sub-mesh (as ProcMesh::slice).
  absl::StatusOr<HostMesh> slice(std::string_view dim, const Selector& selector) const;

  // Starts the product of per_host's sizes procs on every host of this
  // view; the mesh has shape {hosts..., per_host...}. Returns once all have
  // joined. Errors name the host: an agent that is gone, a proc that exits
  // before joining, a join timeout; every proc started is killed then.
  absl::StatusOr<ProcMesh> spawn_procs(const Shape& per_host, HostSpawnOptions options = {}) const;

  // Kills every proc on these hosts (all of the attachment, also when
  // called on a slice) and ends their agents. Idempotent.
  absl::Status shutdown() const;

 private:
  struct State;
  HostMesh(std::shared_ptr<State> state, Shape shape) : state_(std::move(state)), shape_(std::move(shape)) {}
  std::shared_ptr<State> state_;
  Shape shape_;
};

}  // namespace castmesh
