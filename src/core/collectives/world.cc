// Communicator::world(): the SPMD bootstrap. Every process of a job started
// by a launcher becomes a proc; rank 0 listens on the rendezvous address
// and the others join it (WorldJoin); once all have, rank 0 answers each
// with the roster of every rank's proc id (WorldRoster). The "world" proc
// service on rank 0 collects the joins, which may arrive before rank 0's
// own world() call.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "castmesh/communicator.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/wire/v1/collectives.pb.h"
#include "core/collectives/comm_group.h"
#include "core/collectives/exchange.h"
#include "core/collectives/handles.h"
#include "core/progress/request_state.h"
#include "core/log/log.h"
#include "core/proc/launch_env.h"
#include "core/proc/proc_host.h"
#include "core/transport/unix_socket_names.h"
#include "core/wire/status_code.h"

namespace castmesh {
namespace {

namespace v1 = wire::v1;
constexpr char kWorldService[] = "collectives.world";

// Rank 0's side of the bootstrap: joins by rank until `size` are in.
class WorldService final : public proc::ProcService {
 public:
  explicit WorldService(proc::ProcHost& host) : host_(&host) {
    host.on_control(v1::WorldJoin().GetTypeName(), [this](const ProcId& peer, uint64_t correlation, const std::string& payload) {
      on_join(peer, correlation, payload);
    });
  }
  void detach() override {
    detail::MutexLock lock(mu_);
    host_ = nullptr;
  }

  // This proc is rank 0 of a world of `size`: answer the joins once all
  // are in; returns the roster, or an error after `timeout`.
  absl::StatusOr<std::vector<ProcId>> lead(int size, const ProcId& self, absl::Duration timeout) {
    detail::MutexLock lock(mu_);
    size_ = size;
    self_ = self;
    answer_if_complete();
    auto complete = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return answered_; };
    if (!answered_cv_.wait_for(lock, timeout, complete)) {
      std::vector<std::string> missing;
      for (int r = 1; r < size_; ++r) {
        if (!joined_.contains(r)) missing.push_back(std::to_string(r));
      }
      return absl::DeadlineExceededError(absl::StrCat("world: ranks ", absl::StrJoin(missing, ", "),
                                                      " did not join rank 0 within ", absl::FormatDuration(timeout)));
    }
    return roster_;
  }

 private:
  struct Joined {
    ProcId peer;
    uint64_t correlation = 0;
  };

  void on_join(const ProcId& peer, uint64_t correlation, const std::string& payload) {
    v1::WorldJoin join;
    detail::MutexLock lock(mu_);
    if (!join.ParseFromString(payload)) return reply(peer, correlation, absl::InvalidArgumentError("malformed WorldJoin"));
    const int rank = static_cast<int>(join.rank());
    if (size_ != 0 && static_cast<int>(join.size()) != size_) {
      return reply(peer, correlation, absl::InvalidArgumentError(absl::StrCat(
                                          "world: rank ", rank, " was started for ", join.size(),
                                          " ranks but rank 0 for ", size_)));
    }
    if (rank <= 0) return reply(peer, correlation, absl::InvalidArgumentError(absl::StrCat("world: rank ", rank, " cannot join")));
    if (auto it = joined_.find(rank); it != joined_.end() && it->second.peer != peer) {
      return reply(peer, correlation, absl::InvalidArgumentError(absl::StrCat(
                                          "world: rank ", rank, " joined twice, from ", it->second.peer, " and ", peer)));
    }
    // A joiner asks again until answered (its first try may have come while
    // this proc was not ready); the latest request is the one it waits on.
    joined_[rank] = Joined{peer, correlation};
    if (answered_) return reply(peer, correlation, absl::OkStatus());
    answer_if_complete();
  }

  void answer_if_complete() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (answered_ || size_ == 0 || static_cast<int>(joined_.size()) < size_ - 1) return;
    roster_.assign(static_cast<size_t>(size_), ProcId());
    roster_[0] = self_;
    for (auto& [rank, j] : joined_) {
      if (rank < size_) roster_[static_cast<size_t>(rank)] = j.peer;
    }
    for (auto& [rank, j] : joined_) {
      reply(j.peer, j.correlation,
            rank < size_ ? absl::OkStatus()
                         : absl::InvalidArgumentError(absl::StrCat("world: rank ", rank, " of only ", size_)));
    }
    answered_ = true;
    answered_cv_.notify_all();
  }

  void reply(const ProcId& peer, uint64_t correlation, const absl::Status& st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (host_ == nullptr) return;
    v1::WorldRoster roster;
    if (st.ok()) {
      for (const ProcId& p : roster_) roster.add_procs(p);
    } else {
      wire::status_to_wire(st, &roster);
    }
    (void)host_->send_control(peer, roster, correlation, /*is_reply=*/true);
  }

  detail::Mutex mu_;
  detail::CondVar answered_cv_;  // answered_ became true
  proc::ProcHost* host_ ABSL_GUARDED_BY(mu_);
  int size_ ABSL_GUARDED_BY(mu_) = 0;
  ProcId self_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, Joined> joined_ ABSL_GUARDED_BY(mu_);
  std::vector<ProcId> roster_ ABSL_GUARDED_BY(mu_);
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
};

[[maybe_unused]] const bool kRegistered = [] {
  proc::register_proc_service(kWorldService, [](proc::ProcHost& host) -> std::shared_ptr<proc::ProcService> {
    return std::make_shared<WorldService>(host);
  });
  return true;
}();

// A job key shared by every rank of one launch on one host, for the
// defaults of a single-host job.
std::string job_key() {
  for (const char* name : {"OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE", "SLURM_JOB_ID"}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') {
      std::string key = v;
      if (const char* step = std::getenv("SLURM_STEP_ID"); step != nullptr && std::string_view(name) == "SLURM_JOB_ID") {
        absl::StrAppend(&key, ".", step);
      }
      return absl::StrReplaceAll(key, {{"/", "-"}, {"@", "-"}, {":", "-"}});
    }
  }
  return absl::StrCat("ppid", ::getppid());  // ranks started by one launcher process
}

// A single-host job's rendezvous: an abstract Unix name where they exist,
// else a socket file in this user's private socket folder.
absl::StatusOr<std::string> default_rendezvous(const std::string& key) {
  if (transport::abstract_unix_sockets_supported()) return absl::StrCat("unix:@castmesh-world-", key);
  absl::StatusOr<std::string> folder = transport::private_socket_folder();
  if (!folder.ok()) return folder.status();
  return absl::StrCat("unix:", *folder, "/world-", key);
}

// The worker-launch view of this process's environment, with the world's
// defaults for the rendezvous address and the secret.
absl::StatusOr<proc::WorkerLaunch> world_launch(const WorldOptions& options) {
  const std::string key = job_key();
  std::string rendezvous = options.rendezvous;
  if (rendezvous.empty() && std::getenv(proc::kEnvRendezvous) != nullptr) rendezvous = std::getenv(proc::kEnvRendezvous);
  if (rendezvous.empty()) {
    absl::StatusOr<std::string> address = default_rendezvous(key);
    if (!address.ok()) return address.status();
    rendezvous = *std::move(address);
  }
  const std::string secret = !options.secret.empty() ? options.secret
                             : std::getenv(proc::kEnvSecret) != nullptr ? std::string(std::getenv(proc::kEnvSecret))
                                                                        : absl::StrCat("castmesh-world-", key);
  return proc::worker_launch_from([&](const char* name) -> const char* {
    if (std::string_view(name) == proc::kEnvRendezvous) return rendezvous.c_str();
    if (std::string_view(name) == proc::kEnvSecret) return secret.c_str();
    if (std::string_view(name) == proc::kEnvBootstrap) return nullptr;
    return std::getenv(name);
  });
}

absl::StatusOr<std::vector<ProcId>> join_rank_zero(proc::ProcHost& host, const proc::WorkerLaunch& launch,
                                                   absl::Duration timeout) {
  v1::WorldJoin join;
  join.set_rank(static_cast<uint32_t>(launch.rank));
  join.set_size(static_cast<uint32_t>(launch.world_size));
  join.set_pid(::getpid());
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last;
  // Rank 0 answers once everyone is in; asking again every few seconds
  // covers a request it never saw (sent before it was ready).
  constexpr absl::Duration kRetry = absl::Seconds(2);
  while (absl::Now() < deadline) {
    absl::StatusOr<std::string> answer =
        host.request(launch.controller, join, std::min(kRetry, deadline - absl::Now()));
    if (!answer.ok()) {  // rank 0 not up yet, busy waiting for others, or gone: try again until the deadline
      last = answer.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    // Dialled before rank 0 listened, it was reported lost: it is not.
    collectives::Exchange::instance().on_peer_alive(launch.controller);
    v1::WorldRoster roster;
    if (!roster.ParseFromString(*answer)) return absl::InternalError("world: malformed roster from rank 0");
    if (roster.error_code() != 0) return wire::status_from_wire(roster);
    if (roster.procs_size() > 0) collectives::Exchange::instance().on_peer_alive(roster.procs(0));
    return std::vector<ProcId>(roster.procs().begin(), roster.procs().end());
  }
  return absl::DeadlineExceededError(absl::StrCat("world: rank ", launch.rank, " could not join rank 0 at ",
                                                  launch.controller, " within ", absl::FormatDuration(timeout), ": ",
                                                  last.message()));
}

// The process's world: its runtime and proc, kept until exit, when every
// rank meets in a barrier (MPI_Finalize) so none tears down its transport
// while another still waits for its data.
struct World {
  std::unique_ptr<Runtime> runtime;
  std::shared_ptr<proc::ProcHost> host;
  std::optional<Communicator> comm;
};

detail::Mutex world_mu;
World* the_world ABSL_GUARDED_BY(world_mu) = nullptr;

void finalize_world() {
  World* world;
  {
    detail::MutexLock lock(world_mu);
    world = std::exchange(the_world, nullptr);
  }
  if (world == nullptr) return;
  if (world->comm) (void)world->comm->ibarrier().wait(absl::Seconds(30));
  world->comm.reset();
  world->host.reset();
  world->runtime.reset();
  delete world;
}

absl::StatusOr<Communicator> make_world(const WorldOptions& options) {
  absl::StatusOr<proc::WorkerLaunch> launch = world_launch(options);
  if (!launch.ok()) return absl::Status(launch.status().code(), absl::StrCat("world: ", launch.status().message()));
  auto world = std::make_unique<World>();
  world->runtime = std::make_unique<Runtime>();
  proc::ProcHostOptions host_options;
  host_options.listen = launch->rank == 0 ? launch->controller : launch->listen;
  host_options.advertise_host = launch->advertise_host;
  host_options.secret = launch->secret;
  absl::StatusOr<std::shared_ptr<proc::ProcHost>> host = proc::ProcHost::attach(*world->runtime, host_options);
  if (!host.ok()) {
    return absl::Status(host.status().code(), absl::StrCat("world: rank ", launch->rank, " cannot listen on ",
                                                           host_options.listen, ": ", host.status().message()));
  }
  world->host = *host;
  // CASTMESH_JOIN_TIMEOUT, when set, overrides the option.
  const absl::Duration timeout =
      std::getenv(proc::kEnvJoinTimeout) != nullptr ? launch->join_timeout : options.join_timeout;
  absl::StatusOr<std::vector<ProcId>> roster;
  if (launch->rank == 0) {
    auto service = std::static_pointer_cast<WorldService>(world->host->service(kWorldService));
    roster = service->lead(launch->world_size, world->host->id(), timeout);
  } else {
    roster = join_rank_zero(*world->host, *launch, timeout);
  }
  if (!roster.ok()) return roster.status();
  detail::CommGroup::Layout layout;
  layout.id = absl::StrCat("world:", launch->controller);
  layout.description = absl::StrCat("world communicator (", launch->rank_origin, ")");
  layout.rank = launch->rank;
  layout.shape = *Shape::Create({{"ranks", static_cast<size_t>(launch->world_size)}});
  layout.procs = *std::move(roster);
  layout.self_proc = world->host->id();
  layout.host = world->host;
  world->comm = collectives_internal::Handles::communicator(detail::CommGroup::Get(std::move(layout), /*pin=*/true));
  Communicator comm = *world->comm;
  detail::MutexLock lock(world_mu);
  the_world = world.release();
  std::atexit(finalize_world);
  return comm;
}

}  // namespace

absl::StatusOr<Communicator> Communicator::world(WorldOptions options) {
  static detail::Mutex once_mu;
  detail::MutexLock once(once_mu);  // one bootstrap at a time; later calls reuse it
  {
    detail::MutexLock lock(world_mu);
    if (the_world != nullptr) return *the_world->comm;
  }
  return make_world(options);
}

}  // namespace castmesh
