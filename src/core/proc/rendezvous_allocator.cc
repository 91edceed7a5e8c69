// RendezvousAllocator: procs started by a launcher (mpirun, srun, a
// Kubernetes Job) join this controller at its listen address.
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/proc_mesh.h"
#include "core/log/log.h"
#include "core/proc/join.h"
#include "core/proc/launch_env.h"
#include "core/proc/proc_host.h"
#include "core/proc/proc_mesh_state.h"
#include "core/proc/remote_supervision.h"
#include "core/transport/address.h"

namespace castmesh {
namespace {

// The secret the procs must prove: the option, else this process's
// CASTMESH_SECRET, else (for a runtime that is already a proc) its own.
std::string rendezvous_secret(const RendezvousAllocatorOptions& options, const proc::ProcHost* host) {
  if (!options.secret.empty()) return options.secret;
  if (const char* env = std::getenv(proc::kEnvSecret); env != nullptr && *env != '\0') return env;
  return host != nullptr ? host->secret() : std::string();
}

}  // namespace

absl::StatusOr<std::shared_ptr<proc::ProcHost>> RendezvousAllocator::listening_host(Runtime& runtime) {
  const RendezvousAllocatorOptions& options = options_;
  std::shared_ptr<proc::ProcHost> host = proc::ProcHost::of(runtime);
  const std::string secret = rendezvous_secret(options, host.get());
  if (host) {
    if (secret != host->secret()) {
      return absl::FailedPreconditionError(
          "this runtime is already a proc with another mesh secret; use a fresh Runtime for the rendezvous");
    }
    // Its own listener (made by listen()), or one it is told to share.
    if (host != host_ && !options.listen.empty() && options.listen != host->id()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this runtime is already a proc at ", host->id(), " (a proc has one address) and cannot also listen at ",
          options.listen, "; leave RendezvousAllocatorOptions::listen empty to use ", host->id(),
          ", or use a fresh Runtime"));
    }
    host_ = host;
    return host;
  }
  if (secret.empty()) {
    return absl::InvalidArgumentError(
        "a rendezvous needs the mesh secret the procs are given (CASTMESH_SECRET): set "
        "RendezvousAllocatorOptions::secret or CASTMESH_SECRET");
  }
  if (options.listen.empty()) {
    return absl::InvalidArgumentError(
        "RendezvousAllocatorOptions::listen is required, e.g. \"tcp:0.0.0.0:29500\" (every interface) or "
        "\"tcp:HOST:0\" (a free port)");
  }
  absl::StatusOr<transport::ChannelAddress> address = transport::parse_channel_address(options.listen);
  if (!address.ok()) return address.status();
  if (address->kind == transport::ChannelAddress::Kind::kLocal) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot rendezvous at ", options.listen, ": other processes cannot reach a local: address"));
  }
  proc::ProcHostOptions host_options;
  host_options.listen = options.listen;
  host_options.secret = secret;
  host_options.tls = transport::TlsFiles{options.tls_ca, options.tls_cert, options.tls_key};
  if (address->kind == transport::ChannelAddress::Kind::kTcp && proc::is_wildcard_host(address->host)) {
    host_options.advertise_host =
        options.advertise_host.empty() ? proc::default_advertise_host() : options.advertise_host;
  }
  auto attached = proc::ProcHost::attach(runtime, host_options);
  if (!attached.ok()) return attached.status();
  CASTMESH_LOG_INFO("castmesh-proc {}: waiting for procs (listening on {})", (*attached)->id(), options.listen);
  host_ = *attached;
  return host_;
}

RendezvousAllocator::RendezvousAllocator(RendezvousAllocatorOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::string> RendezvousAllocator::listen(Runtime& runtime) {
  detail::MutexLock allocation(proc::allocation_mutex());
  absl::StatusOr<std::shared_ptr<proc::ProcHost>> host = listening_host(runtime);
  if (!host.ok()) return host.status();
  return (*host)->id();
}

absl::StatusOr<ProcMesh> RendezvousAllocator::allocate(Runtime& runtime, int procs) {
  absl::StatusOr<Shape> shape = detail::line_shape(procs);
  if (!shape.ok()) return shape.status();
  return allocate(runtime, *shape);
}

absl::StatusOr<ProcMesh> RendezvousAllocator::allocate(Runtime& runtime, const Shape& requested) {
  absl::StatusOr<Shape> shape = detail::mesh_shape(requested);
  if (!shape.ok()) return shape.status();
  const int procs = static_cast<int>(shape->size());
  if (procs <= 0) return absl::InvalidArgumentError("a proc mesh needs at least one proc");
  detail::MutexLock allocation(proc::allocation_mutex());
  absl::StatusOr<std::shared_ptr<proc::ProcHost>> listening = listening_host(runtime);
  if (!listening.ok()) return listening.status();
  std::shared_ptr<proc::ProcHost> host = *std::move(listening);
  const std::string address = host->id();
  if (options_.on_supervision_event) host->supervision().set_root_failure_handler(options_.on_supervision_event);

  proc::JoinBoard board(host, procs);
  absl::Status joined = board.wait(absl::Now() + options_.join_timeout);
  if (joined.code() == absl::StatusCode::kDeadlineExceeded) {
    std::vector<std::string> came;
    for (const auto& proc : board.joined()) {
      if (proc) came.push_back(proc::describe_joined(*proc));
    }
    const std::vector<int> missing = board.missing_ranks();
    joined = absl::DeadlineExceededError(absl::StrCat(
        missing.size() == 1 ? "rank " : "ranks ", absl::StrJoin(missing, ", "), " of a mesh of ", procs,
        " did not join ", address, " within ",
        absl::FormatDuration(options_.join_timeout), came.empty() ? " (no proc joined)" : " (joined: ",
        absl::StrJoin(came, "; "), came.empty() ? "" : ")"));
  }
  if (!joined.ok()) {
    board.release_joined();
    return joined;
  }
  std::vector<ProcInfo> infos;
  for (const auto& proc : board.joined()) {
    infos.push_back(ProcInfo{proc->id, proc->rank, proc->pid, proc->hostname});
    CASTMESH_LOG_DEBUG("castmesh-proc {}: proc {} joined from {}", host->id(), proc::describe_joined(*proc), proc->id);
  }
  // Made while the board still watches: a proc lost in between is known.
  std::shared_ptr<detail::ProcMeshState> state =
      detail::ProcMeshState::create(host, host->secret(), std::move(infos), /*owns_processes=*/false);
  state->mark_gone(board.lost_procs());
  return detail::make_proc_mesh(std::move(state), *std::move(shape));
}

}  // namespace castmesh
