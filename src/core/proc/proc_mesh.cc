// ProcMesh and its shared state: the procs of a mesh, whoever started them
// (LocalAllocator, RendezvousAllocator).
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/wire/v1/control.pb.h"
#include "core/log/log.h"
#include "core/proc/proc_mesh_state.h"
#include "core/proc/remote_supervision.h"
#include "core/trace/recorder.h"
#include "core/wire/status_code.h"

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
    detail::MutexLock lock(mu_);
    if (!closed_) spawned_.push_back({proc, std::move(child), std::move(parent)});
  }

  // After close(), deaths are expected (the mesh is stopping) and not reported.
  void close() {
    detail::MutexLock lock(mu_);
    closed_ = true;
    spawned_.clear();
  }

  // The child's failure was reported by its proc (Supervision), or it
  // stopped normally (its remote monitor said so): its proc's death later is
  // no failure of it.
  void forget(const Address& child) {
    detail::MutexLock lock(mu_);
    std::erase_if(spawned_, [&](const Spawned& s) { return s.child == child; });
  }

  // A worker died: every actor spawned there is a failure for its spawner.
  void on_peer_lost(proc::ProcHost& host, const ProcId& peer, const absl::Status& why) {
    std::vector<Spawned> lost;
    {
      detail::MutexLock lock(mu_);
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
      host.supervision().deliver_failure(s.parent, std::move(event));
    }
  }

 private:
  struct Spawned {
    ProcId proc;
    Address child;
    std::string parent;
  };
  detail::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Spawned> spawned_ ABSL_GUARDED_BY(mu_);
};

// Procs of a mesh whose connection was lost (they exited, were killed, or
// became unreachable). Written on the I/O thread, read by stop().
struct Departures {
  detail::Mutex mu;
  detail::CondVar cv;
  absl::flat_hash_set<ProcId> gone ABSL_GUARDED_BY(mu);
};

std::shared_ptr<ProcMeshState> ProcMeshState::create(std::shared_ptr<proc::ProcHost> host, std::string secret,
                                                     std::vector<ProcInfo> procs, bool owns_processes) {
  std::shared_ptr<ProcMeshState> state(new ProcMeshState());
  state->host_ = std::move(host);
  state->secret_ = std::move(secret);
  state->procs_ = std::move(procs);
  state->owns_processes_ = owns_processes;
  state->ledger_ = std::make_shared<SpawnLedger>();
  state->departures_ = std::make_shared<Departures>();
  proc::ProcHost* raw = state->host_.get();  // the observers live inside the host
  for (const ProcInfo& p : state->procs_) {
    raw->describe_peer(p.id, absl::StrCat("rank ", p.rank, ", pid ", p.pid, p.hostname.empty() ? "" : " on ",
                                          p.hostname));
  }
  state->observer_id_ = raw->add_peer_lost_observer(
      [ledger = state->ledger_, raw](const ProcId& peer, const absl::Status& why) { ledger->on_peer_lost(*raw, peer, why); });
  state->failure_observer_id_ = raw->supervision().add_failure_observer(
      [ledger = state->ledger_](const ProcId&, const SupervisionEvent& event) { ledger->forget(event.child); });
  state->departure_observer_id_ =
      raw->add_peer_lost_observer([departures = state->departures_](const ProcId& peer, const absl::Status&) {
        detail::MutexLock lock(departures->mu);
        departures->gone.insert(peer);
        departures->cv.notify_all();
      });
  return state;
}

ProcMeshState::~ProcMeshState() { (void)stop(); }

void ProcMeshState::mark_gone(const std::vector<ProcId>& procs) {
  detail::MutexLock lock(departures_->mu);
  for (const ProcId& p : procs) departures_->gone.insert(p);
}

absl::Status ProcMeshState::stop() {
  {
    detail::MutexLock lock(mu_);
    if (stopped_) return absl::OkStatus();
    stopped_ = true;
  }
  ledger_->close();
  host_->remove_peer_lost_observer(observer_id_);
  host_->supervision().remove_failure_observer(failure_observer_id_);
  for (const ProcInfo& p : procs_) (void)host_->send_control(p.id, wire::v1::Stop());
  constexpr std::chrono::seconds kGrace(5);
  if (!owns_processes_) {
    const std::vector<ProcInfo> staying = await_departures(kGrace);
    host_->remove_peer_lost_observer(departure_observer_id_);
    if (staying.empty()) return absl::OkStatus();
    std::vector<std::string> named;
    for (const ProcInfo& p : staying) {
      named.push_back(absl::StrCat(p.id, " (rank ", p.rank, ", pid ", p.pid, p.hostname.empty() ? "" : " on ",
                                   p.hostname, ")"));
    }
    if (straggler_killer_) {
      absl::Status killed = straggler_killer_(staying);
      return absl::DeadlineExceededError(absl::StrCat(
          staying.size(), " proc(s) did not exit within ", kGrace.count(), "s of being asked to: ",
          absl::StrJoin(named, ", "),
          killed.ok() ? "; their host agents killed them" : absl::StrCat("; killing them failed: ", killed.message())));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        staying.size(), " proc(s) did not exit within ", kGrace.count(), "s of being asked to: ",
        absl::StrJoin(named, ", "), "; they were started by a launcher, not by this process, so their launcher "
        "(srun, mpirun, the Kubernetes Job) must end them"));
  }
  host_->remove_peer_lost_observer(departure_observer_id_);
  std::vector<pid_t> pids;
  for (const ProcInfo& p : procs_) pids.push_back(static_cast<pid_t>(p.pid));
  const int killed = reap(pids, kGrace);
  if (killed > 0) {
    return absl::DeadlineExceededError(absl::StrCat(killed, " worker proc(s) did not exit within 5s and were killed"));
  }
  return absl::OkStatus();
}

std::vector<ProcInfo> ProcMeshState::await_departures(std::chrono::milliseconds grace) {
  std::vector<ProcInfo> staying;
  detail::MutexLock lock(departures_->mu);
  departures_->cv.wait_for(lock, absl::FromChrono(grace), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(departures_->mu) {
    for (const ProcInfo& p : procs_) {
      if (!departures_->gone.contains(p.id)) return false;
    }
    return true;
  });
  for (const ProcInfo& p : procs_) {
    if (!departures_->gone.contains(p.id)) staying.push_back(p);
  }
  return staying;
}

int ProcMeshState::reap(std::vector<pid_t> pids, std::chrono::milliseconds grace) {
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

absl::StatusOr<Shape> mesh_shape(const Shape& requested) {
  absl::StatusOr<Slice> row_major = Slice::RowMajor(requested.sizes());
  if (!row_major.ok()) return row_major.status();
  return Shape::Create(requested.labels(), *std::move(row_major));
}

absl::StatusOr<Shape> line_shape(int procs) {
  if (procs <= 0) return absl::InvalidArgumentError("a proc mesh needs at least one proc");
  return Shape::Create({{"procs", static_cast<size_t>(procs)}});
}

ProcMesh make_proc_mesh(std::shared_ptr<ProcMeshState> state, Shape shape) {
  return ProcMesh(std::move(state), std::move(shape));
}

}  // namespace detail

ProcMesh::ProcMesh(std::shared_ptr<detail::ProcMeshState> state, Shape shape)
    : state_(std::move(state)), shape_(std::move(shape)) {
  auto procs = std::make_shared<std::vector<ProcInfo>>();
  for (size_t rank : shape_.slice().ranks()) procs->push_back(state_->procs().at(rank));
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
  return state_ ? state_->secret() : kNone;
}

Runtime& ProcMesh::runtime() const { return state_->host()->runtime(); }

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
    const int64_t trace_start_ns = trace::on() ? trace::now_ns() : 0;
    auto answer = state_->host()->request(p.id, request, absl::Seconds(30));
    // A slice per actor spawned: "spawn <name>", its class as detail, the proc's rank as value.
    if (trace_start_ns != 0) {
      trace::slice(trace::Category::kSpawn, trace::intern(absl::StrCat("spawn ", name)), trace_start_ns,
                   trace::now_ns(), static_cast<uint64_t>(p.rank), trace::intern(actor_type));
    }
    if (!answer.ok()) return answer.status();
    wire::v1::SpawnReply reply;
    if (!reply.ParseFromString(*answer)) return absl::InternalError("malformed SpawnReply");
    if (reply.error_code() != 0) {
      return wire::status_from_wire(reply.error_code(), absl::StrCat("spawning ", actor_type, " on proc rank ",
                                                                     p.rank, ": ", reply.error_message()));
    }
    auto address = Address::parse(reply.address());
    if (!address.ok()) return address.status();
    state_->ledger()->record(p.id, *address, request.parent());
    // A child that stops normally is forgotten too. Only a normal stop
    // (reason OK): a failure is forgotten through its Supervision message,
    // and the DownEvent of its proc's death must not race with the ledger's
    // own report of that death.
    runtime().monitor(runtime().resolve(*address), [ledger = std::weak_ptr<detail::SpawnLedger>(state_->ledger()),
                                                    child = *address](const DownEvent& event) {
      if (!event.reason.ok()) return;
      if (auto l = ledger.lock()) l->forget(child);
    });
    addresses.push_back(std::move(*address));
  }
  return addresses;
}

}  // namespace castmesh
