// Procs: castmesh across operating-system processes.
//
//  * castmesh::init(argc, argv): call first in main(). In a process started
//    by a LocalAllocator it runs the worker proc and never returns (SPMD: the
//    same binary is both controller and worker).
//  * CASTMESH_REGISTER_ACTOR(Type, CtorArgs...): lets other procs spawn Type
//    by name with serializable constructor arguments.
//  * LocalAllocator::allocate(runtime, shape) (or a count n): starts one
//    worker proc per point of the shape on this machine and returns a
//    ProcMesh once all have joined.
//  * RendezvousAllocator::allocate(runtime, shape): procs started by a
//    launcher (mpirun, srun, a Kubernetes Job) join at a rendezvous address.
//  * ProcMesh::slice(...): a sub-mesh (a view sharing the workers).
//  * ProcMesh::spawn<A>(name, args...): one actor of A per proc; the refs
//    work from any proc exactly like local ones.
//
// See docs/procs.md. Thread-safety is stated per type.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/time/time.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "castmesh/address.h"
#include "castmesh/message.h"
#include "castmesh/ref.h"
#include "castmesh/runtime.h"
#include "castmesh/shape.h"
#include "castmesh/supervision.h"

namespace castmesh {

// Process bootstrap. Call at the top of main(), before creating a Runtime.
// If this process was started by a LocalAllocator (environment variable
// CASTMESH_BOOTSTRAP set) or by a launcher for a RendezvousAllocator
// (CASTMESH_RENDEZVOUS set), it becomes a worker proc: it joins its
// controller, serves actor spawn requests and messages, and exits the
// process (std::exit) when the controller stops it, disconnects or dies;
// init() then never returns. A worker that cannot join exits with status 1,
// one whose environment is wrong (e.g. a rank that is not a number) with 2,
// each with the reason on stderr. Otherwise it records argv (the default worker command
// re-executes this binary with it) and returns. Main thread only.
void init(int argc, char** argv);

// For worker hosts that are not a C++ main() (e.g. `python -m
// castmesh._worker` through the Python extension): true when this process
// was started as a worker (CASTMESH_BOOTSTRAP or CASTMESH_RENDEZVOUS set).
bool launched_as_worker();
// Runs this process as its worker proc, as init() does, but returns the
// exit code instead of exiting. `runtime_options` configure the worker's
// Runtime; its on_unhandled_failure sees the failures that are not of actors
// spawned for another proc (those go to their spawner). Main thread.
int run_worker(RuntimeOptions runtime_options = {});

namespace detail {

// How a proc spawns a registered actor type from encoded arguments.
struct ActorFactory {
  std::string name;                    // registration name (wire name)
  std::vector<std::string> arg_types;  // C++ names of the constructor arguments
  std::function<absl::StatusOr<Address>(Runtime&, SpawnOptions, const std::vector<std::string>& args)> spawn;
};
// Registers `factory` for the actor class `class_id`. Thread-safe; meant for
// static initialisation. A second registration of a name keeps the first.
void register_actor_factory(uint32_t class_id, ActorFactory factory);
// The registration name of an actor class, or "" if it is not registered.
std::string registered_actor_name(uint32_t class_id);

template <typename A, typename... Args, std::size_t... I>
absl::StatusOr<Address> spawn_from_encoded(Runtime& runtime, SpawnOptions options,
                                           const std::vector<std::string>& args, std::index_sequence<I...>) {
  std::tuple<Args...> values;
  absl::Status status;
  ((status.ok() ? (void)(status = decode_value(args[I], &std::get<I>(values))) : (void)0), ...);
  if (!status.ok()) return status;
  auto ref = runtime.spawn_with<A>(std::move(options), std::move(std::get<I>(values))...);
  if (!ref.ok()) return ref.status();
  return ref->address();
}

class ProcMeshState;

}  // namespace detail

namespace proc {
class ProcHost;
}  // namespace proc

class ProcMesh;
namespace detail {
ProcMesh make_proc_mesh(std::shared_ptr<ProcMeshState> state, Shape shape);
}  // namespace detail

// Registers actor class A under `name` with constructor arguments Args...
// (each needs a codec: arithmetic, std::string, protobuf messages, or one
// registered with CASTMESH_REGISTER_MESSAGE). Prefer the macro below.
template <typename A, typename... Args>
bool register_actor(std::string name) {
  detail::ActorFactory factory;
  factory.name = std::move(name);
  factory.arg_types = {std::string(type_name<Args>())...};
  factory.spawn = [](Runtime& runtime, SpawnOptions options,
                     const std::vector<std::string>& args) -> absl::StatusOr<Address> {
    if (args.size() != sizeof...(Args)) {
      return absl::InvalidArgumentError("wrong number of constructor arguments for " +
                                        std::string(type_name<A>()));
    }
    return detail::spawn_from_encoded<A, std::decay_t<Args>...>(runtime, std::move(options), args,
                                                               std::index_sequence_for<Args...>{});
  };
  detail::register_actor_factory(type_id<A>(), std::move(factory));
  return true;
}

#define CASTMESH_DETAIL_CONCAT2(a, b) a##b
#define CASTMESH_DETAIL_CONCAT(a, b) CASTMESH_DETAIL_CONCAT2(a, b)
// At namespace scope in a .cc file linked into every proc (controller and
// workers): CASTMESH_REGISTER_ACTOR(Counter, int, std::string);
#define CASTMESH_REGISTER_ACTOR(Type, ...)                                                   \
  static const bool CASTMESH_DETAIL_CONCAT(castmesh_actor_registered_, __LINE__) [[maybe_unused]] = \
      ::castmesh::register_actor<Type __VA_OPT__(, ) __VA_ARGS__>(#Type)

// One proc of a mesh. Plain value.
struct ProcInfo {
  ProcId id;             // its address, e.g. "unix:@castmesh-1234-0a1b2c3d4e5f" (Linux),
                         // "unix:/tmp/castmesh-501/1234-0a1b2c3d4e5f" (elsewhere)
  int rank = 0;          // 0..size-1 in the mesh as allocated (a slice keeps it)
  int64_t pid = 0;       // operating-system process id, on its own host
  std::string hostname;  // the name of the host it runs on (as it reported it)
};

// How a LocalAllocator starts worker procs. Plain value.
struct LocalAllocatorOptions {
  // A worker that has not joined by then fails the allocation.
  absl::Duration join_timeout = absl::Seconds(30);
  // The worker command. Empty: re-execute this binary (Linux /proc/self/exe,
  // macOS _NSGetExecutablePath, FreeBSD KERN_PROC_PATHNAME, elsewhere argv[0]
  // as given to castmesh::init) with
  // the argv given to castmesh::init. Otherwise e.g.
  // {"python3", "-m", "castmesh._worker"}; argv[0] is looked up in PATH.
  std::vector<std::string> worker_argv;
  // Extra environment variables for the workers.
  std::vector<std::pair<std::string, std::string>> worker_env;
  // "unix" (default: abstract Unix sockets on Linux, socket files in a private
  // per-user folder elsewhere) or "tcp" (IPv4 loopback).
  std::string transport = "unix";
  // Mesh secret; empty: a fresh random one. Passed to workers through the
  // environment (CASTMESH_SECRET, removed from the worker's environment once
  // read).
  std::string secret;
  // Failures of actors spawned on workers by a plain thread (no parent
  // actor), and of such actors whose proc died. Runs on a transport thread;
  // must not block. Default: logged at error.
  std::function<void(const SupervisionEvent&)> on_supervision_event;
};

// How a RendezvousAllocator waits for procs started by a launcher (mpirun,
// srun, a Kubernetes Job). Plain value. See docs/procs.md, "Running on a
// cluster".
struct RendezvousAllocatorOptions {
  // Where this controller listens for the procs, e.g. "tcp:0.0.0.0:29500"
  // (every interface), "tcp:10.0.0.5:0" (port 0: a free port, read back with
  // RendezvousAllocator::listen) or "unix:@name" (procs on this machine
  // only). Required unless the runtime is already a proc (it then keeps its
  // address; `listen` must be empty or that address).
  std::string listen;
  // For a wildcard listen host (0.0.0.0, ::): the host name or address the
  // procs reach this controller at; it becomes the host part of the
  // rendezvous address. Empty: $CASTMESH_ADVERTISE_HOST, else this
  // machine's host name if it resolves to a non-loopback address, else its
  // first non-loopback IPv4 address.
  std::string advertise_host;
  // Procs that have not joined by then fail the allocation
  // (kDeadlineExceeded naming the missing ranks).
  absl::Duration join_timeout = absl::Seconds(60);
  // The mesh secret the procs must prove (they read it from
  // CASTMESH_SECRET). Empty: this process's CASTMESH_SECRET; one of the two
  // is required (a rendezvous never runs without authentication).
  std::string secret;
  // Mutual TLS on the listener's TCP connections (docs/security.md): the CA
  // file, this controller's certificate and its private key (0600), all
  // three or none. The procs then need CASTMESH_TLS_CA/_CERT/_KEY too.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  // As LocalAllocatorOptions::on_supervision_event.
  std::function<void(const SupervisionEvent&)> on_supervision_event;
};

// A set of procs addressed by a Shape, e.g. {hosts: 1, gpus: 4}: the proc
// of rank r (0..size-1, row-major) sits at the point of base rank r. A slice
// (slice(...)) is a view of some of the procs: same workers, same ranks,
// nothing copied.
// Copies and slices share the procs; when the last of them goes away (or
// stop() is called) the workers are asked to exit, and killed if they do not
// within a few seconds. Every copy must be gone before the Runtime it was
// allocated on is destroyed. Any thread may call spawn/stop, but not an
// endpoint's I/O thread (they block for the replies).
class ProcMesh {
 public:
  // An empty mesh (size 0); allocate one with a LocalAllocator.
  ProcMesh() = default;

  size_t size() const;
  // The points of this mesh (or slice); point.rank() is the proc's rank.
  // An empty mesh has the 0-dimensional shape (but size() 0).
  const Shape& shape() const;
  // The procs of this mesh, in row-major order of shape().
  const std::vector<ProcInfo>& procs() const;
  // The proc at row-major position `position` of shape() (its rank, unless
  // this is a slice). Throws std::out_of_range past the end.
  const ProcInfo& proc(size_t position) const;
  // A sub-mesh: an index drops the dimension, a Range keeps it (errors as
  // Shape::select), e.g. procs.slice("gpus", Range(0, 4, 2)).
  absl::StatusOr<ProcMesh> slice(std::string_view dim, const Selector& selector) const;
  absl::StatusOr<ProcMesh> slice(std::initializer_list<std::pair<std::string_view, Selector>> selections) const;
  // The secret of the mesh (e.g. for procs that join by other means).
  const std::string& secret() const;
  // The controller's runtime (the one given to LocalAllocator::allocate).
  Runtime& runtime() const;

  // Spawns one actor of A on every proc of this mesh (or slice), named
  // `name` with index = the proc's rank, from constructor arguments args
  // (encoded with their codecs; A must be registered with matching argument
  // types). Refs in the order of procs(). Its parent is the spawning proc's
  // root: failures go to LocalAllocatorOptions::on_supervision_event.
  template <typename A, typename... Args>
  absl::StatusOr<std::vector<ActorRef<A>>> spawn(const std::string& name, const Args&... args) const {
    return spawn_supervised<A>(Address{}, name, args...);
  }
  // Same, with `parent` (a local actor) receiving the supervision events
  // (Actor::on_child_failed) of the spawned actors.
  template <typename A, typename... Args>
  absl::StatusOr<std::vector<ActorRef<A>>> spawn_supervised(const Address& parent, const std::string& name,
                                                           const Args&... args) const {
    std::vector<std::string> encoded(sizeof...(Args));
    std::vector<std::string> arg_types = {std::string(type_name<Args>())...};
    absl::Status status;
    std::size_t i = 0;
    ((status.ok() ? (void)(status = detail::encode_value(args, &encoded[i++])) : (void)0), ...);
    if (!status.ok()) return status;
    auto addresses = spawn_encoded(type_id<A>(), name, std::move(encoded), std::move(arg_types), parent);
    if (!addresses.ok()) return addresses.status();
    std::vector<ActorRef<A>> refs;
    refs.reserve(addresses->size());
    for (Address& a : *addresses) {
      auto ref = runtime().resolve(a).template as<A>();
      if (!ref.ok()) return ref.status();
      refs.push_back(std::move(*ref));
    }
    return refs;
  }

  // Asks every worker of the mesh (all of it, also when called on a slice)
  // to exit and waits for them (killing stragglers after 5 s). Idempotent.
  absl::Status stop();

  // Untyped spawn used by the templates.
  absl::StatusOr<std::vector<Address>> spawn_encoded(uint32_t class_id, const std::string& name,
                                                     std::vector<std::string> args,
                                                     std::vector<std::string> arg_types,
                                                     const Address& parent) const;

 private:
  friend ProcMesh detail::make_proc_mesh(std::shared_ptr<detail::ProcMeshState> state, Shape shape);
  ProcMesh(std::shared_ptr<detail::ProcMeshState> state, Shape shape);

  std::shared_ptr<detail::ProcMeshState> state_;
  Shape shape_;                                        // this view
  std::shared_ptr<const std::vector<ProcInfo>> procs_;  // the procs of this view, in its row-major order
};

// Starts worker procs on this machine (fork/exec). Thread-safe.
class LocalAllocator {
 public:
  explicit LocalAllocator(LocalAllocatorOptions options = {});
  // Starts one worker per point of `shape` (rank r = row-major position r)
  // and returns once all have joined; the mesh's shape() has the same
  // dimensions. `runtime` becomes a proc of the mesh (its proc id is set to
  // its listen address): call this before spawning actors on it. Errors: a
  // worker that exits or does not join within join_timeout
  // (kDeadlineExceeded, naming its rank and pid); every worker started is
  // killed in that case.
  absl::StatusOr<ProcMesh> allocate(Runtime& runtime, const Shape& shape);
  // `procs` workers in one dimension named "procs".
  absl::StatusOr<ProcMesh> allocate(Runtime& runtime, int procs);

 private:
  LocalAllocatorOptions options_;
};

// Makes a mesh of procs started by a launcher (mpirun, srun, a Kubernetes
// Job), which join this controller at a rendezvous address. Each proc runs
// castmesh::init (or `python -m castmesh._worker`) with CASTMESH_RENDEZVOUS
// (the address), CASTMESH_SECRET, and its rank and world size from
// CASTMESH_RANK / CASTMESH_WORLD_SIZE or its launcher's variables
// (OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE, SLURM_PROCID/NTASKS,
// JOB_COMPLETION_INDEX). No cluster manager: the launcher starts, places and
// ends the processes. Thread-safe (allocations are serialized per process).
class RendezvousAllocator {
 public:
  explicit RendezvousAllocator(RendezvousAllocatorOptions options = {});
  // Makes `runtime` a proc listening at options.listen (if it is not one
  // yet) and returns the address to give the procs as CASTMESH_RENDEZVOUS,
  // e.g. "tcp:node7:29500" (the runtime's proc id; the real port for port
  // 0). Procs may be launched before or after this: they keep trying to
  // join until their CASTMESH_JOIN_TIMEOUT (60 s). allocate() calls it.
  // Call before spawning actors on `runtime`. The allocator keeps the
  // runtime listening while it lives (and each mesh while it lives), so
  // destroy it before the runtime.
  absl::StatusOr<std::string> listen(Runtime& runtime);
  // Waits until shape.size() procs have joined and returns their mesh: the
  // proc of rank r (the rank it reported, not its arrival order) at
  // row-major position r. Errors, each failing the allocation at once and
  // telling every proc that had joined to exit: a proc with another world
  // size (kInvalidArgument), a rank out of range (kOutOfRange), a rank that
  // two procs claim (kAlreadyExists), a joined proc lost before the mesh is
  // complete (kUnavailable); and after join_timeout, kDeadlineExceeded
  // naming the ranks that never joined. A connection that cannot prove the
  // secret is refused by the transport and never counts. The procs are not
  // this process's children: stop() asks them to exit and waits 5 s, but
  // cannot kill one that stays (it is reported; its launcher ends it).
  absl::StatusOr<ProcMesh> allocate(Runtime& runtime, const Shape& shape);
  // `procs` procs in one dimension named "procs".
  absl::StatusOr<ProcMesh> allocate(Runtime& runtime, int procs);

 private:
  // The runtime's proc, made or found by listen(); kept so that it listens
  // until allocate() (guarded by the process's allocation mutex).
  absl::StatusOr<std::shared_ptr<proc::ProcHost>> listening_host(Runtime& runtime);

  RendezvousAllocatorOptions options_;
  std::shared_ptr<proc::ProcHost> host_;
};

}  // namespace castmesh
