// How a worker proc learns, from its environment, whom to join and as which
// rank: from a LocalAllocator (CASTMESH_BOOTSTRAP, its parent) or from a
// launcher (CASTMESH_RENDEZVOUS plus the launcher's own rank variables:
// mpirun, srun, a Kubernetes indexed Job). Also where such a proc listens so
// that its controller can reach it. See docs/procs.md, "Running on a cluster".
// Pure functions of their inputs (and of the network configuration for the
// address helpers); any thread.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/transport/tls.h"

namespace castmesh::proc {

// Descriptor a LocalAllocator's worker reads the mesh secret from (a pipe
// holding the secret, then end of file): the secret is never in a worker's
// environment, so neither /proc/<pid>/environ nor a child started with a
// copy of the environment sees it. A worker launched with CASTMESH_SECRET
// in its environment instead (by srun, mpirun, ...) erases it at start.
inline constexpr char kEnvSecretFd[] = "CASTMESH_SECRET_FD";
// The heartbeat of a worker's connections in milliseconds (a HostMesh's
// settings, handed on by its host agents): how often an idle connection
// sends one, and after how long without a frame a peer is lost. Parsed by
// the settings table (castmesh/config.h, heartbeat_*_ms).
inline constexpr char kEnvHeartbeatIntervalMs[] = "CASTMESH_HEARTBEAT_INTERVAL_MS";
inline constexpr char kEnvHeartbeatTimeoutMs[] = "CASTMESH_HEARTBEAT_TIMEOUT_MS";
// Mutual TLS of a worker's TCP connections: the paths of the CA, its
// certificate and its private key (a file only its user can read). Paths,
// never key material: a host agent passes its own files to its procs.
inline constexpr char kEnvTlsCa[] = "CASTMESH_TLS_CA";
inline constexpr char kEnvTlsCert[] = "CASTMESH_TLS_CERT";
inline constexpr char kEnvTlsKey[] = "CASTMESH_TLS_KEY";

// Where a worker's rank and world size were read from, in this order of
// precedence (the first whose rank variable is set wins; CASTMESH_WORLD_SIZE,
// when set, overrides the size of any of them).
struct RankSource {
  const char* launcher;       // e.g. "Slurm (srun)"
  const char* rank_variable;  // e.g. "SLURM_PROCID"
  const char* size_variable;  // e.g. "SLURM_NTASKS"; nullptr: only CASTMESH_WORLD_SIZE
};
inline constexpr RankSource kRankSources[] = {
    {"castmesh", "CASTMESH_RANK", "CASTMESH_WORLD_SIZE"},
    {"Open MPI (mpirun)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"MPICH / Hydra (mpiexec)", "PMI_RANK", "PMI_SIZE"},
    {"Slurm (srun)", "SLURM_PROCID", "SLURM_NTASKS"},
    {"Kubernetes indexed Job", "JOB_COMPLETION_INDEX", nullptr},
};

// What a worker proc needs to join its mesh. Plain value.
struct WorkerLaunch {
  std::string controller;       // address to join: CASTMESH_BOOTSTRAP or CASTMESH_RENDEZVOUS
  std::string secret;           // CASTMESH_SECRET
  int rank = 0;
  int world_size = 0;
  std::string rank_origin;      // "SLURM_PROCID=3, SLURM_NTASKS=4", for messages
  std::string listen;           // this proc's listen address ("" = a fresh Unix address, abstract on Linux)
  std::string advertise_host;   // for a wildcard `listen` (CASTMESH_ADVERTISE_HOST)
  bool started_by_controller = false;  // a LocalAllocator's child (CASTMESH_BOOTSTRAP)
  absl::Duration join_timeout = absl::Seconds(60);  // how long to keep trying to join
  absl::Duration heartbeat_interval = absl::Milliseconds(500);  // CASTMESH_HEARTBEAT_INTERVAL_MS
  absl::Duration heartbeat_timeout = absl::Seconds(5);          // CASTMESH_HEARTBEAT_TIMEOUT_MS
  transport::TlsFiles tls;  // CASTMESH_TLS_CA / _CERT / _KEY; all empty: no TLS
};

// Reads a variable; nullptr when unset. Lets tests parse a made-up environment.
using EnvLookup = std::function<const char*(const char* name)>;

// True when the environment asks this process to be a worker proc
// (CASTMESH_BOOTSTRAP or CASTMESH_RENDEZVOUS set and not empty).
bool worker_requested(const EnvLookup& env);

// The launch of a worker from its environment. The secret comes from
// CASTMESH_SECRET, else from the descriptor CASTMESH_SECRET_FD (read to its
// end and closed). Errors (InvalidArgument, naming the
// variable and its value): an unreadable secret descriptor, no controller address, a rank or size
// that is not a non-negative integer, rank >= size, no world size, no secret
// for a rendezvous, a rendezvous address that is not tcp: or unix:. For a tcp:
// rendezvous the proc listens on the local address of the route to the
// controller (or, with CASTMESH_ADVERTISE_HOST, on every interface and
// advertises that host); for unix:, on a fresh Unix address (abstract on
// Linux, a socket file in a private folder elsewhere).
absl::StatusOr<WorkerLaunch> worker_launch_from(const EnvLookup& env);
// The same from this process's environment.
absl::StatusOr<WorkerLaunch> worker_launch_from_environment();

// The local IP address this machine uses to reach `host` (a name or literal),
// e.g. "10.1.2.3" (no packet is sent). Errors: unknown host, no route.
absl::StatusOr<std::string> local_address_towards(const std::string& host);

// The host name or address other machines reach this one at, for a listener
// on a wildcard address: CASTMESH_ADVERTISE_HOST if set; else this
// machine's host name if it resolves to a non-loopback address; else its
// first non-loopback IPv4 interface address; else "127.0.0.1".
std::string default_advertise_host();

// True for 0.0.0.0, ::, and "" (a listener on every interface).
bool is_wildcard_host(const std::string& host);

}  // namespace castmesh::proc
