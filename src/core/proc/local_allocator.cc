// LocalAllocator and ProcMesh: worker procs started on this machine.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/wire/v1/control.pb.h"
#include "core/log/log.h"
#include "core/proc/proc_host.h"
#include "core/proc/worker.h"
#include "core/wire/handshake.h"
#include "core/wire/status_code.h"

extern char** environ;

namespace castmesh {
namespace detail {

// The actors a ProcMesh spawned, so that a worker's death becomes a
// supervision event for each of their spawners. Thread-safe: written by
// spawning threads, read on the endpoint's I/O thread. Kept apart from
// ProcMeshState so that the I/O thread never holds the last reference to a
// proc mesh (whose destructor stops and reaps workers and may release the
// ProcHost that owns the I/O thread itself).
class SpawnLedger {
 public:
  void record(const ProcId& proc, Address child, std::string parent) {
    std::lock_guard lock(mu_);
    if (!closed_) spawned_.push_back({proc, std::move(child), std::move(parent)});
  }

  // After close(), deaths are expected (the mesh is stopping) and not reported.
  void close() {
    std::lock_guard lock(mu_);
    closed_ = true;
    spawned_.clear();
  }

  // The child's failure was reported by its proc (Supervision), or it
  // stopped normally (its remote monitor said so): its proc's death later is
  // no failure of it.
  void forget(const Address& child) {
    std::lock_guard lock(mu_);
    std::erase_if(spawned_, [&](const Spawned& s) { return s.child == child; });
  }

  // A worker died: every actor spawned there is a failure for its spawner.
  void on_peer_lost(proc::ProcHost& host, const ProcId& peer, const absl::Status& why) {
    std::vector<Spawned> lost;
    {
      std::lock_guard lock(mu_);
      if (closed_) return;
      for (const Spawned& s : spawned_) {
        if (s.proc == peer) lost.push_back(s);
      }
      std::erase_if(spawned_, [&](const Spawned& s) { return s.proc == peer; });
    }
    for (Spawned& s : lost) {
      SupervisionEvent event;
      event.child = s.child;
      event.origin = s.child;
      event.reason = why;
      host.deliver_failure(s.parent, std::move(event));
    }
  }

 private:
  struct Spawned {
    ProcId proc;
    Address child;
    std::string parent;
  };
  std::mutex mu_;
  bool closed_ = false;
  std::vector<Spawned> spawned_;
};

// Shared by the copies of one ProcMesh; destroyed on the thread that drops
// the last copy. Thread-safe.
class ProcMeshState {
 public:
  std::shared_ptr<proc::ProcHost> host;
  std::vector<ProcInfo> procs;
  std::string secret;
  uint64_t observer_id = 0;          // peer-lost observer of the ledger
  uint64_t failure_observer_id = 0;  // remote-failure observer of the ledger
  std::shared_ptr<SpawnLedger> ledger = std::make_shared<SpawnLedger>();

  ~ProcMeshState() { (void)stop(); }

  absl::Status stop() {
    {
      std::lock_guard lock(mu_);
      if (stopped_) return absl::OkStatus();
      stopped_ = true;
    }
    ledger->close();
    if (host) {
      host->remove_peer_lost_observer(observer_id);
      host->remove_remote_failure_observer(failure_observer_id);
      for (const ProcInfo& p : procs) (void)host->send_control(p.id, wire::v1::Stop());
    }
    std::vector<pid_t> pids;
    for (const ProcInfo& p : procs) pids.push_back(static_cast<pid_t>(p.pid));
    const int killed = reap(pids, std::chrono::seconds(5));
    if (killed > 0) {
      return absl::DeadlineExceededError(absl::StrCat(killed, " worker proc(s) did not exit within 5s and were killed"));
    }
    return absl::OkStatus();
  }

  // Waits up to `grace` for `pids` to exit, then SIGKILLs and reaps the
  // rest. Returns how many had to be killed.
  static int reap(std::vector<pid_t> pids, std::chrono::milliseconds grace) {
    const auto deadline = std::chrono::steady_clock::now() + grace;
    while (!pids.empty() && std::chrono::steady_clock::now() < deadline) {
      std::erase_if(pids, [](pid_t pid) {
        int status = 0;
        const pid_t r = ::waitpid(pid, &status, WNOHANG);
        return r == pid || r < 0;
      });
      if (!pids.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (pid_t pid : pids) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    return static_cast<int>(pids.size());
  }

 private:
  std::mutex mu_;
  bool stopped_ = false;
};

}  // namespace detail

namespace {

// Joins received while an allocation waits.
struct JoinBoard {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<pid_t> pids;
  std::vector<std::optional<ProcId>> joined;  // by rank
  size_t count = 0;
};

std::vector<std::string> default_worker_argv() {
  std::vector<std::string> argv = proc::recorded_argv();
  if (argv.empty()) {
    // castmesh::init was not called: re-read our own command line.
    std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
    std::string arg;
    while (std::getline(cmdline, arg, '\0')) argv.push_back(arg);
  }
  if (argv.empty()) argv.push_back("castmesh-worker");
  argv[0] = "/proc/self/exe";
  return argv;
}

// One serialized allocation at a time per process (the Join handler is
// per host, and hosts are per runtime).
std::mutex& allocation_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}

}  // namespace

LocalAllocator::LocalAllocator(LocalAllocatorOptions options) : options_(std::move(options)) {}

absl::StatusOr<ProcMesh> LocalAllocator::allocate(Runtime& runtime, int procs) {
  if (procs <= 0) return absl::InvalidArgumentError("a proc mesh needs at least one proc");
  absl::StatusOr<Shape> shape = Shape::Create({{"procs", static_cast<size_t>(procs)}});
  if (!shape.ok()) return shape.status();
  return allocate(runtime, *shape);
}

absl::StatusOr<ProcMesh> LocalAllocator::allocate(Runtime& runtime, const Shape& requested) {
  // The mesh is numbered 0..n-1 row-major, whatever view `requested` was.
  absl::StatusOr<Slice> row_major = Slice::RowMajor(requested.sizes());
  if (!row_major.ok()) return row_major.status();
  absl::StatusOr<Shape> shape = Shape::Create(requested.labels(), *std::move(row_major));
  if (!shape.ok()) return shape.status();
  const int procs = static_cast<int>(shape->size());
  if (options_.transport != "unix" && options_.transport != "tcp") {
    return absl::InvalidArgumentError(absl::StrCat("unknown transport '", options_.transport, "' (unix or tcp)"));
  }
  std::lock_guard allocation(allocation_mutex());
  std::shared_ptr<proc::ProcHost> host = proc::ProcHost::of(runtime);
  std::string secret = options_.secret;
  if (host) {
    if (!secret.empty() && secret != host->secret()) {
      return absl::FailedPreconditionError("this runtime is already a proc of a mesh with another secret");
    }
    secret = host->secret();
  } else {
    if (secret.empty()) secret = wire::make_secret();
    proc::ProcHostOptions host_options;
    host_options.listen = options_.transport == "tcp" ? "tcp:127.0.0.1:0" : "";
    host_options.secret = secret;
    auto attached = proc::ProcHost::attach(runtime, host_options);
    if (!attached.ok()) return attached.status();
    host = std::move(*attached);
  }
  if (options_.on_supervision_event) host->set_root_failure_handler(options_.on_supervision_event);

  auto board = std::make_shared<JoinBoard>();
  board->joined.resize(static_cast<size_t>(procs));
  host->on_control(wire::v1::Join().GetTypeName(),
                   [board](const ProcId& peer, uint64_t, const std::string& payload) {
                     wire::v1::Join join;
                     if (!join.ParseFromString(payload)) return;
                     std::lock_guard lock(board->mu);
                     const size_t rank = join.rank();
                     if (rank >= board->joined.size() || board->joined[rank] || rank >= board->pids.size() ||
                         board->pids[rank] != static_cast<pid_t>(join.pid())) {
                       CASTMESH_LOG_WARN("ignoring unexpected join of rank {} (pid {}) from {}", join.rank(),
                                         join.pid(), peer);
                       return;
                     }
                     board->joined[rank] = peer;
                     ++board->count;
                     board->cv.notify_all();
                   });

  // Start the workers.
  const std::vector<std::string> argv_strings =
      options_.worker_argv.empty() ? default_worker_argv() : options_.worker_argv;
  std::vector<std::string> base_env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    if (entry.starts_with("CASTMESH_BOOTSTRAP=") || entry.starts_with("CASTMESH_SECRET=") ||
        entry.starts_with("CASTMESH_RANK=") || entry.starts_with("CASTMESH_WORLD_SIZE=") ||
        entry.starts_with("CASTMESH_TRANSPORT=") || entry.starts_with("CASTMESH_PARENT_PID=")) {
      continue;
    }
    base_env.emplace_back(entry);
  }
  for (const auto& [key, value] : options_.worker_env) base_env.push_back(key + "=" + value);
  base_env.push_back(absl::StrCat(proc::kEnvBootstrap, "=", host->id()));
  base_env.push_back(absl::StrCat(proc::kEnvSecret, "=", secret));
  base_env.push_back(absl::StrCat(proc::kEnvWorldSize, "=", procs));
  base_env.push_back(absl::StrCat(proc::kEnvTransport, "=", options_.transport));
  base_env.push_back(absl::StrCat(proc::kEnvParentPid, "=", ::getpid()));

  std::vector<pid_t> pids;
  auto kill_all = [&pids] { detail::ProcMeshState::reap(pids, std::chrono::milliseconds(0)); };
  auto fail = [&](absl::Status error) {
    kill_all();
    host->on_control(wire::v1::Join().GetTypeName(), {});
    return error;
  };
  std::vector<char*> argv;
  for (const std::string& a : argv_strings) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (int rank = 0; rank < procs; ++rank) {
    std::vector<std::string> env = base_env;
    env.push_back(absl::StrCat(proc::kEnvRank, "=", rank));
    std::vector<char*> envp;
    for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    pid_t pid = 0;
    const int rc = ::posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data());
    if (rc != 0) {
      return fail(absl::UnavailableError(
          absl::StrCat("cannot start worker rank ", rank, " ('", argv_strings[0], "'): ", std::strerror(rc))));
    }
    pids.push_back(pid);
    std::lock_guard lock(board->mu);
    board->pids.push_back(pid);
  }

  // Wait for every join, a worker's early exit, or the deadline.
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(options_.join_timeout);
  while (true) {
    {
      std::unique_lock lock(board->mu);
      if (board->count == static_cast<size_t>(procs)) break;
      board->cv.wait_for(lock, std::chrono::milliseconds(20));
      if (board->count == static_cast<size_t>(procs)) break;
    }
    for (int rank = 0; rank < procs; ++rank) {
      int status = 0;
      if (::waitpid(pids[rank], &status, WNOHANG) == pids[rank]) {
        pids.erase(pids.begin() + rank);
        return fail(absl::UnavailableError(absl::StrCat(
            "worker rank ", rank, " (pid ", board->pids[rank], ", '", argv_strings[0], "') exited before joining (",
            WIFEXITED(status) ? absl::StrCat("exit status ", WEXITSTATUS(status))
                              : absl::StrCat("signal ", WTERMSIG(status)),
            ")")));
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string missing;
      {
        std::lock_guard lock(board->mu);
        for (int rank = 0; rank < procs; ++rank) {
          if (!board->joined[rank]) absl::StrAppend(&missing, missing.empty() ? "" : ", ", "rank ", rank, " (pid ", pids[rank], ")");
        }
      }
      return fail(absl::DeadlineExceededError(absl::StrCat("worker proc(s) ", missing, " started with '",
                                                           argv_strings[0], "' did not join within ",
                                                           absl::FormatDuration(options_.join_timeout))));
    }
  }
  host->on_control(wire::v1::Join().GetTypeName(), {});

  auto state = std::make_shared<detail::ProcMeshState>();
  state->host = host;
  state->secret = secret;
  for (int rank = 0; rank < procs; ++rank) {
    ProcInfo info{*board->joined[rank], rank, pids[rank]};
    host->describe_peer(info.id, absl::StrCat("rank ", rank, ", pid ", info.pid));
    CASTMESH_LOG_DEBUG("castmesh-proc {}: worker rank {} (pid {}) joined from {}", host->id(), rank, info.pid, info.id);
    state->procs.push_back(std::move(info));
  }
  // The observer lives inside `host`, so the raw pointer outlives every call.
  state->observer_id = host->add_peer_lost_observer(
      [ledger = state->ledger, raw = host.get()](const ProcId& peer, const absl::Status& why) {
        ledger->on_peer_lost(*raw, peer, why);
      });
  state->failure_observer_id = host->add_remote_failure_observer(
      [ledger = state->ledger](const ProcId&, const SupervisionEvent& event) { ledger->forget(event.child); });
  return ProcMesh(std::move(state), *std::move(shape));
}

ProcMesh::ProcMesh(std::shared_ptr<detail::ProcMeshState> state, Shape shape)
    : state_(std::move(state)), shape_(std::move(shape)) {
  auto procs = std::make_shared<std::vector<ProcInfo>>();
  for (size_t rank : shape_.slice().ranks()) procs->push_back(state_->procs.at(rank));
  procs_ = std::move(procs);
}

size_t ProcMesh::size() const { return procs().size(); }

const Shape& ProcMesh::shape() const { return shape_; }

const std::vector<ProcInfo>& ProcMesh::procs() const {
  static const std::vector<ProcInfo> kNone;
  return procs_ ? *procs_ : kNone;
}

const ProcInfo& ProcMesh::proc(size_t position) const { return procs().at(position); }

absl::StatusOr<ProcMesh> ProcMesh::slice(std::string_view dim, const Selector& selector) const {
  if (!state_) return absl::FailedPreconditionError("empty proc mesh");
  absl::StatusOr<Shape> view = shape_.select(dim, selector);
  if (!view.ok()) return view.status();
  return ProcMesh(state_, *std::move(view));
}

absl::StatusOr<ProcMesh> ProcMesh::slice(
    std::initializer_list<std::pair<std::string_view, Selector>> selections) const {
  if (!state_) return absl::FailedPreconditionError("empty proc mesh");
  absl::StatusOr<Shape> view = shape_.select(selections);
  if (!view.ok()) return view.status();
  return ProcMesh(state_, *std::move(view));
}

const std::string& ProcMesh::secret() const {
  static const std::string kNone;
  return state_ ? state_->secret : kNone;
}

Runtime& ProcMesh::runtime() const { return state_->host->runtime(); }

absl::Status ProcMesh::stop() { return state_ ? state_->stop() : absl::OkStatus(); }

absl::StatusOr<std::vector<Address>> ProcMesh::spawn_encoded(uint32_t class_id, const std::string& name,
                                                             std::vector<std::string> args,
                                                             std::vector<std::string> arg_types,
                                                             const Address& parent) const {
  if (!state_) return absl::FailedPreconditionError("empty proc mesh");
  const std::string actor_type = detail::registered_actor_name(class_id);
  if (actor_type.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("actor class ", std::string(detail::type_name_of(class_id)),
                                                      " is not registered (CASTMESH_REGISTER_ACTOR)"));
  }
  wire::v1::SpawnRequest request;
  request.set_actor_type(actor_type);
  request.set_name(name);
  for (std::string& a : args) request.add_args(std::move(a));
  for (std::string& t : arg_types) request.add_arg_types(std::move(t));
  if (!parent.empty()) request.set_parent(parent.to_string());
  std::vector<Address> addresses;
  for (const ProcInfo& p : procs()) {
    request.set_index(static_cast<uint64_t>(p.rank));
    auto answer = state_->host->request(p.id, request, absl::Seconds(30));
    if (!answer.ok()) return answer.status();
    wire::v1::SpawnReply reply;
    if (!reply.ParseFromString(*answer)) return absl::InternalError("malformed SpawnReply");
    if (reply.error_code() != 0) {
      return wire::status_from_wire(reply.error_code(), absl::StrCat("spawning ", actor_type, " on proc rank ",
                                                                     p.rank, ": ", reply.error_message()));
    }
    auto address = Address::parse(reply.address());
    if (!address.ok()) return address.status();
    state_->ledger->record(p.id, *address, request.parent());
    // A child that stops normally is forgotten too. Only a normal stop
    // (reason OK): a failure is forgotten through its Supervision message,
    // and the DownEvent of its proc's death must not race with the ledger's
    // own report of that death.
    runtime().monitor(runtime().resolve(*address), [ledger = std::weak_ptr<detail::SpawnLedger>(state_->ledger),
                                                    child = *address](const DownEvent& event) {
      if (!event.reason.ok()) return;
      if (auto l = ledger.lock()) l->forget(child);
    });
    addresses.push_back(std::move(*address));
  }
  return addresses;
}

}  // namespace castmesh
