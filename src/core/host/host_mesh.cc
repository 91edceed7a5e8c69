// HostMesh: the controller's side of host agents (docs/hosts.md). Attaching
// is one HostAttach request per agent; spawning asks each agent to start
// its share of the procs, which then join this controller like procs
// started by a launcher (core/proc/join.h), checked against the pids the
// agents reported.
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <future>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/host_mesh.h"
#include "core/host/host_tls.h"
#include "castmesh/wire/v1/host.pb.h"
#include "core/config/settings.h"
#include "core/host/host_address.h"
#include "core/log/log.h"
#include "core/platform/cpu_binding.h"
#include "core/proc/join.h"
#include "core/proc/launch_env.h"
#include "core/proc/proc_host.h"
#include "core/proc/proc_mesh_state.h"
#include "core/proc/remote_supervision.h"
#include "core/proc/worker_spawn.h"
#include "core/transport/address.h"
#include "core/wire/status_code.h"

namespace castmesh {
namespace host {
namespace {

namespace v1 = wire::v1;

// Exits of procs that agents report (HostProcExited), by agent and pid, for
// the spawns that wait for those procs to join. One per ProcHost.
class ExitBoard {
 public:
  struct Exit {
    uint32_t rank = 0;
    int exit_status = 0;
    int signal = 0;
  };

  // The board of `host`, installing its handler on first use.
  static std::shared_ptr<ExitBoard> of(proc::ProcHost& host) {
    static detail::Mutex mu;
    static absl::flat_hash_map<proc::ProcHost*, std::weak_ptr<ExitBoard>> boards;
    detail::MutexLock lock(mu);
    std::weak_ptr<ExitBoard>& slot = boards[&host];
    if (std::shared_ptr<ExitBoard> board = slot.lock()) return board;
    auto board = std::make_shared<ExitBoard>();
    host.on_control(v1::HostProcExited().GetTypeName(),
                    [weak = std::weak_ptr<ExitBoard>(board)](const ProcId& agent, uint64_t, const std::string& payload) {
                      v1::HostProcExited exited;
                      std::shared_ptr<ExitBoard> live = weak.lock();
                      if (live && exited.ParseFromString(payload)) live->record(agent, exited);
                    });
    slot = board;
    return board;
  }

  void record(const ProcId& agent, const v1::HostProcExited& exited) {
    detail::MutexLock lock(mu_);
    // Bounded: only exits of procs being spawned are ever asked for.
    if (exits_.size() > 4096) exits_.clear();
    exits_[absl::StrCat(agent, "#", exited.pid())] = Exit{exited.rank(), exited.exit_status(), exited.signal()};
  }

  std::optional<Exit> find(const ProcId& agent, int64_t pid) const {
    detail::MutexLock lock(mu_);
    auto it = exits_.find(absl::StrCat(agent, "#", pid));
    if (it == exits_.end()) return std::nullopt;
    return it->second;
  }

 private:
  mutable detail::Mutex mu_;
  absl::flat_hash_map<std::string, Exit> exits_ ABSL_GUARDED_BY(mu_);
};

uint32_t millis(absl::Duration d) { return static_cast<uint32_t>(std::max<int64_t>(1, absl::ToInt64Milliseconds(d))); }

// The runtime's proc, made to listen on TCP where the agents can reach it.
absl::StatusOr<std::shared_ptr<proc::ProcHost>> controller_proc(Runtime& runtime, const HostMeshOptions& options,
                                                               const transport::TlsFiles& tls,
                                                               const std::string& first_agent) {
  std::shared_ptr<proc::ProcHost> host = proc::ProcHost::of(runtime);
  absl::StatusOr<transport::ChannelAddress> agent = transport::parse_channel_address(first_agent);
  if (!agent.ok()) return agent.status();
  const bool loopback_agent = absl::StartsWith(agent->host, "127.") || agent->host == "::1" ||
                              agent->host == "localhost";
  if (host) {
    if (!options.secret.empty() && options.secret != host->secret()) {
      return absl::FailedPreconditionError(
          "this controller is already a proc with another mesh secret (a process has one)");
    }
    if (host->uses_tls() != tls.enabled()) {
      // One listener per process: the agents' procs dial it, so its TLS must
      // be what they speak.
      return absl::FailedPreconditionError(absl::StrCat(
          "this controller is already a proc ", host->uses_tls() ? "with" : "without",
          " mutual TLS, and attach asks for ", tls.enabled() ? "TLS" : "no TLS",
          " (a process has one listener): attach before starting procs, with the same credentials"));
    }
    const bool tcp = absl::StartsWith(host->id(), "tcp:");
    const bool loopback_self = absl::StartsWith(host->id(), "tcp:127.") || absl::StartsWith(host->id(), "tcp:[::1]");
    if (!loopback_agent && (!tcp || loopback_self)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this controller already listens at ", host->id(), ", which procs on other hosts cannot reach (a process "
          "has one address); attach to the hosts before starting procs on this one"));
    }
    return host;
  }
  absl::StatusOr<std::string> secret = resolve_mesh_secret(options.secret);
  if (!secret.ok()) return secret.status();
  proc::ProcHostOptions host_options;
  host_options.secret = *std::move(secret);
  host_options.tls = tls;
  if (!options.listen.empty()) {
    host_options.listen = options.listen;
  } else if (loopback_agent) {
    host_options.listen = "tcp:127.0.0.1:0";
  } else {
    absl::StatusOr<std::string> local = proc::local_address_towards(agent->host);
    if (!local.ok()) {
      return absl::UnavailableError(absl::StrCat("cannot reach host agent ", first_agent, ": ",
                                                 local.status().message()));
    }
    host_options.listen = "tcp:0.0.0.0:0";
    host_options.advertise_host = *std::move(local);
  }
  absl::StatusOr<transport::ChannelAddress> listen = transport::parse_channel_address(host_options.listen);
  if (listen.ok() && listen->kind == transport::ChannelAddress::Kind::kTcp && proc::is_wildcard_host(listen->host) &&
      host_options.advertise_host.empty()) {
    host_options.advertise_host = proc::default_advertise_host();
  }
  return proc::ProcHost::attach(runtime, host_options);
}

}  // namespace
}  // namespace host

struct HostMesh::State {
  std::shared_ptr<proc::ProcHost> host;
  HostMeshOptions options;
  std::vector<HostInfo> hosts;  // by host rank
  std::shared_ptr<host::ExitBoard> exits;
  detail::Mutex mu;
  bool shut_down ABSL_GUARDED_BY(mu) = false;

  std::string describe(const HostInfo& info) const {
    return absl::StrCat("host ", info.hostname.empty() ? info.address : info.hostname, " (agent ", info.address, ")");
  }

  // SIGKILLs `pids` on agent `info` (all of this controller's there when
  // empty) and waits for its answer.
  absl::Status kill_on(const HostInfo& info, const std::vector<int64_t>& pids) const {
    host::v1::HostKillProcs request;
    for (int64_t pid : pids) request.add_pids(pid);
    absl::StatusOr<std::string> payload = host->request(info.agent, request, absl::Seconds(10));
    if (!payload.ok()) return payload.status();
    host::v1::HostKillReply reply;
    if (!reply.ParseFromString(*payload)) return absl::InternalError("malformed HostKillReply");
    return wire::status_from_wire(reply);
  }
};

absl::StatusOr<std::string> resolve_mesh_secret(const std::string& explicit_secret) {
  return host::resolve_mesh_secret(explicit_secret);
}

absl::StatusOr<HostMesh> HostMesh::attach(Runtime& runtime, const std::vector<std::string>& workers,
                                          HostMeshOptions options) {
  if (workers.empty()) return absl::InvalidArgumentError("attach needs at least one host agent address");
  absl::StatusOr<transport::TlsFiles> tls = host::tls_files_of(options.ca, options.cert, options.private_key);
  if (!tls.ok()) return tls.status();
  if (options.heartbeat_interval <= absl::ZeroDuration() || options.heartbeat_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError("heartbeat_timeout must be longer than heartbeat_interval, both positive");
  }
  std::vector<std::string> dial;
  for (const std::string& worker : workers) {
    absl::StatusOr<std::string> address = host::agent_dial_address(worker);
    if (!address.ok()) return address.status();
    if (std::find(dial.begin(), dial.end(), *address) != dial.end()) {
      return absl::InvalidArgumentError(absl::StrCat("host agent ", worker, " is listed twice"));
    }
    dial.push_back(*std::move(address));
  }
  absl::StatusOr<std::shared_ptr<proc::ProcHost>> host = host::controller_proc(runtime, options, *tls, dial.front());
  if (!host.ok()) return host.status();
  auto state = std::make_shared<State>();
  state->host = *std::move(host);
  state->options = options;
  state->exits = host::ExitBoard::of(*state->host);
  if (options.on_supervision_event) state->host->supervision().set_root_failure_handler(options.on_supervision_event);

  host::v1::HostAttach request;
  request.set_name(options.name);
  request.set_heartbeat_interval_ms(host::millis(options.heartbeat_interval));
  request.set_heartbeat_timeout_ms(host::millis(options.heartbeat_timeout));
  std::vector<std::future<absl::StatusOr<HostInfo>>> answers;
  for (size_t i = 0; i < dial.size(); ++i) {
    state->host->set_peer_heartbeat(dial[i], options.heartbeat_interval, options.heartbeat_timeout);
    state->host->describe_peer(dial[i], absl::StrCat("host agent ", workers[i]));
    answers.push_back(std::async(std::launch::async, [&, i]() -> absl::StatusOr<HostInfo> {
      absl::StatusOr<std::string> payload = state->host->request(dial[i], request, options.attach_timeout);
      if (!payload.ok()) return payload.status();
      host::v1::HostAttachReply reply;
      if (!reply.ParseFromString(*payload)) return absl::InternalError("malformed HostAttachReply");
      if (absl::Status st = wire::status_from_wire(reply); !st.ok()) return st;
      return HostInfo{workers[i], dial[i], reply.hostname(), reply.host_identity(), reply.pid()};
    }));
  }
  std::vector<std::string> failed;
  for (size_t i = 0; i < answers.size(); ++i) {
    absl::StatusOr<HostInfo> info = answers[i].get();
    if (info.ok()) {
      state->host->describe_peer(dial[i], absl::StrCat("host agent ", workers[i], " (", info->hostname, ")"));
      state->hosts.push_back(*std::move(info));
    } else {
      failed.push_back(absl::StrCat(workers[i], ": ", info.status().message()));
    }
  }
  if (!failed.empty()) {
    // Let the agents that did attach go: nothing was started on them.
    for (const HostInfo& info : state->hosts) {
      (void)state->host->request(info.agent, host::v1::HostKillProcs(), absl::Seconds(2));
    }
    return absl::UnavailableError(absl::StrCat(failed.size(), " of ", workers.size(),
                                               " host agent(s) did not attach: ", absl::StrJoin(failed, "; ")));
  }
  absl::StatusOr<Shape> shape = Shape::Create({{"hosts", state->hosts.size()}});
  if (!shape.ok()) return shape.status();
  return HostMesh(std::move(state), *std::move(shape));
}

std::vector<HostInfo> HostMesh::hosts() const {
  std::vector<HostInfo> out;
  if (!state_) return out;
  for (size_t rank : shape_.slice().ranks()) out.push_back(state_->hosts.at(rank));
  return out;
}

absl::StatusOr<HostMesh> HostMesh::slice(std::string_view dim, const Selector& selector) const {
  if (!state_) return absl::FailedPreconditionError("empty host mesh");
  absl::StatusOr<Shape> view = shape_.select(dim, selector);
  if (!view.ok()) return view.status();
  return HostMesh(state_, *std::move(view));
}

absl::StatusOr<ProcMesh> HostMesh::spawn_procs(const Shape& per_host_requested, HostSpawnOptions options) const {
  if (!state_) return absl::FailedPreconditionError("empty host mesh");
  {
    detail::MutexLock lock(state_->mu);
    if (state_->shut_down) return absl::FailedPreconditionError("spawn_procs on a host mesh that was shut down");
  }
  if (absl::Status bind = platform::check_proc_bind(options.proc_bind); !bind.ok()) return bind;
  const std::vector<HostInfo> hosts = this->hosts();
  const size_t per_host = per_host_requested.size();
  std::vector<std::pair<std::string, size_t>> dims;
  for (size_t d = 0; d < shape_.ndim(); ++d) dims.emplace_back(shape_.labels()[d], shape_.sizes()[d]);
  for (size_t d = 0; d < per_host_requested.ndim(); ++d) {
    dims.emplace_back(per_host_requested.labels()[d], per_host_requested.sizes()[d]);
  }
  absl::StatusOr<Shape> world = Shape::Create(dims);
  if (!world.ok()) return world.status();
  const int procs = static_cast<int>(world->size());
  if (procs <= 0 || per_host == 0) return absl::InvalidArgumentError("a proc mesh needs at least one proc");
  std::vector<std::string> argv = options.worker_argv;
  if (argv.empty() && !options.agent_python_worker) {
    absl::StatusOr<std::vector<std::string>> program = proc::default_worker_argv();
    if (!program.ok()) return program.status();
    argv = *std::move(program);
    // The agent starts it: a path of this process's own (/proc/self/exe)
    // would name the agent's program there.
    char resolved[PATH_MAX];
    if (::realpath(argv[0].c_str(), resolved) == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("cannot resolve this program's path (", argv[0],
                                                        ") for the procs' command; set worker_argv"));
    }
    argv[0] = resolved;
  }
  proc::ProcHost& host = *state_->host;
  const HostMeshOptions& mesh_options = state_->options;
  detail::MutexLock allocation(proc::allocation_mutex());

  // What the agents said they started, by rank (0: not yet).
  struct Expected {
    detail::Mutex mu;
    std::vector<int64_t> pids ABSL_GUARDED_BY(mu);
  };
  auto expected = std::make_shared<Expected>();
  {
    detail::MutexLock lock(expected->mu);
    expected->pids.assign(static_cast<size_t>(procs), 0);
  }
  auto host_of_rank = [&](int rank) -> const HostInfo& { return hosts[static_cast<size_t>(rank) / per_host]; };
  proc::JoinBoard board(state_->host, procs, [expected, hosts, per_host](const proc::JoinedProc& proc) {
    int64_t pid = 0;
    {
      detail::MutexLock lock(expected->mu);
      pid = expected->pids[static_cast<size_t>(proc.rank)];
    }
    if (pid == 0) return absl::UnavailableError(absl::StrCat("the proc of rank ", proc.rank, " is still being started"));
    const HostInfo& info = hosts[static_cast<size_t>(proc.rank) / per_host];
    if (proc.pid == pid && (proc.hostname.empty() || proc.hostname == info.hostname)) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat("proc ", proc.id, " (", proc::describe_joined(proc),
                                                    ") is not the proc started for rank ", proc.rank, " on host ",
                                                    info.hostname));
  });
  // Agents lost while their procs start.
  struct Lost {
    detail::Mutex mu;
    std::vector<std::string> why ABSL_GUARDED_BY(mu);
  };
  auto lost = std::make_shared<Lost>();
  absl::flat_hash_map<std::string, std::string> agent_names;
  for (const HostInfo& info : hosts) agent_names[info.agent] = state_->describe(info);
  const uint64_t observer = host.add_peer_lost_observer([lost, agent_names](const ProcId& peer, const absl::Status& why) {
    auto it = agent_names.find(peer);
    if (it == agent_names.end()) return;
    detail::MutexLock lock(lost->mu);
    lost->why.push_back(absl::StrCat(it->second, " was lost: ", why.message()));
  });

  // Ask every agent for its share, all at once.
  std::vector<std::future<absl::Status>> spawned;
  for (size_t h = 0; h < hosts.size(); ++h) {
    spawned.push_back(std::async(std::launch::async, [&, h]() -> absl::Status {
      wire::v1::HostSpawnProcs request;
      request.set_rendezvous(host.id());
      request.set_world_size(static_cast<uint32_t>(procs));
      for (const std::string& a : argv) request.add_argv(a);
      for (const auto& [name, value] : options.worker_env) {
        wire::v1::HostEnvVar* var = request.add_env();
        var->set_name(name);
        var->set_value(value);
      }
      // The settings configured at run time reach the procs as they reach a LocalAllocator's.
      for (const std::string& entry : config::with_runtime_config({})) {
        wire::v1::HostEnvVar* var = request.add_env();
        var->set_name(entry.substr(0, entry.find('=')));
        var->set_value(entry.substr(entry.find('=') + 1));
      }
      request.set_join_timeout_s(static_cast<uint32_t>(std::max<int64_t>(1, absl::ToInt64Seconds(options.join_timeout))));
      request.set_proc_bind(options.proc_bind);
      request.set_heartbeat_interval_ms(host::millis(mesh_options.heartbeat_interval));
      request.set_heartbeat_timeout_ms(host::millis(mesh_options.heartbeat_timeout));
      for (size_t local = 0; local < per_host; ++local) {
        const int rank = static_cast<int>(h * per_host + local);
        wire::v1::HostProcLaunch* launch = request.add_procs();
        launch->set_rank(static_cast<uint32_t>(rank));
        if (options.env_for) {
          absl::StatusOr<Point> point = world->point_at(static_cast<size_t>(rank));
          if (!point.ok()) return point.status();
          for (const auto& [name, value] : options.env_for(*point)) {
            wire::v1::HostEnvVar* var = launch->add_env();
            var->set_name(name);
            var->set_value(value);
          }
        }
      }
      absl::StatusOr<std::string> payload = host.request(hosts[h].agent, request, mesh_options.attach_timeout);
      if (!payload.ok()) return absl::Status(payload.status().code(), absl::StrCat(state_->describe(hosts[h]), ": ",
                                                                                  payload.status().message()));
      wire::v1::HostSpawnReply reply;
      if (!reply.ParseFromString(*payload)) return absl::InternalError("malformed HostSpawnReply");
      if (absl::Status st = wire::status_from_wire(reply); !st.ok()) return st;
      if (reply.pids_size() != static_cast<int>(per_host)) {
        return absl::InternalError(absl::StrCat(state_->describe(hosts[h]), " started ", reply.pids_size(),
                                                " procs instead of ", per_host));
      }
      detail::MutexLock lock(expected->mu);
      for (size_t local = 0; local < per_host; ++local) expected->pids[h * per_host + local] = reply.pids(local);
      return absl::OkStatus();
    }));
  }
  std::vector<std::string> spawn_errors;
  for (auto& f : spawned) {
    if (absl::Status st = f.get(); !st.ok()) spawn_errors.push_back(std::string(st.message()));
  }
  absl::Status joined = spawn_errors.empty()
                            ? absl::OkStatus()
                            : absl::UnavailableError(absl::StrCat("starting procs failed: ", absl::StrJoin(spawn_errors, "; ")));
  if (joined.ok()) {
    joined = board.wait(absl::Now() + options.join_timeout, [&]() -> absl::Status {
      {
        detail::MutexLock lock(lost->mu);
        if (!lost->why.empty()) return absl::UnavailableError(absl::StrJoin(lost->why, "; "));
      }
      const std::vector<int> missing = board.missing_ranks();
      for (int rank : missing) {
        int64_t pid = 0;
        {
          detail::MutexLock lock(expected->mu);
          pid = expected->pids[static_cast<size_t>(rank)];
        }
        const HostInfo& info = host_of_rank(rank);
        if (std::optional<host::ExitBoard::Exit> exit = state_->exits->find(info.agent, pid)) {
          return absl::UnavailableError(absl::StrCat(
              "proc rank ", rank, " (pid ", pid, ") on ", state_->describe(info), " exited before joining (",
              exit->signal != 0 ? absl::StrCat("signal ", exit->signal) : absl::StrCat("exit status ", exit->exit_status),
              "); its stderr is the agent's"));
        }
      }
      return absl::OkStatus();
    });
  }
  if (joined.code() == absl::StatusCode::kDeadlineExceeded) {
    std::vector<std::string> missing;
    for (int rank : board.missing_ranks()) {
      missing.push_back(absl::StrCat("rank ", rank, " on ", host_of_rank(rank).hostname));
    }
    joined = absl::DeadlineExceededError(absl::StrCat("proc(s) ", absl::StrJoin(missing, ", "), " did not join within ",
                                                      absl::FormatDuration(options.join_timeout)));
  }
  host.remove_peer_lost_observer(observer);
  if (!joined.ok()) {
    board.release_joined();
    std::vector<int64_t> pids;
    {
      detail::MutexLock lock(expected->mu);
      pids = expected->pids;
    }
    for (size_t h = 0; h < hosts.size(); ++h) {
      std::vector<int64_t> mine(pids.begin() + static_cast<std::ptrdiff_t>(h * per_host),
                                pids.begin() + static_cast<std::ptrdiff_t>((h + 1) * per_host));
      std::erase(mine, 0);
      if (!mine.empty()) (void)state_->kill_on(hosts[h], mine);
    }
    return joined;
  }
  std::vector<ProcInfo> infos;
  for (const auto& proc : board.joined()) {
    infos.push_back(ProcInfo{proc->id, proc->rank, proc->pid, proc->hostname});
    host.set_peer_heartbeat(proc->id, mesh_options.heartbeat_interval, mesh_options.heartbeat_timeout);
  }
  std::shared_ptr<detail::ProcMeshState> mesh =
      detail::ProcMeshState::create(state_->host, host.secret(), std::move(infos), /*owns_processes=*/false);
  mesh->set_straggler_killer([state = state_, hosts, per_host](const std::vector<ProcInfo>& stragglers) {
    absl::Status result;
    for (size_t h = 0; h < hosts.size(); ++h) {
      std::vector<int64_t> pids;
      for (const ProcInfo& p : stragglers) {
        if (static_cast<size_t>(p.rank) / per_host == h) pids.push_back(p.pid);
      }
      if (!pids.empty()) result.Update(state->kill_on(hosts[h], pids));
    }
    return result;
  });
  mesh->mark_gone(board.lost_procs());
  return detail::make_proc_mesh(std::move(mesh), *std::move(world));
}

absl::Status HostMesh::shutdown() const {
  if (!state_) return absl::OkStatus();
  {
    detail::MutexLock lock(state_->mu);
    if (state_->shut_down) return absl::OkStatus();
    state_->shut_down = true;
  }
  std::vector<std::future<absl::Status>> done;
  for (const HostInfo& info : state_->hosts) {
    done.push_back(std::async(std::launch::async, [this, &info]() -> absl::Status {
      absl::StatusOr<std::string> payload = state_->host->request(info.agent, wire::v1::HostShutdown(), absl::Seconds(10));
      // An agent that ends before its answer leaves has done what was asked.
      if (!payload.ok()) {
        return payload.status().code() == absl::StatusCode::kUnavailable
                   ? absl::OkStatus()
                   : absl::Status(payload.status().code(),
                                  absl::StrCat(state_->describe(info), ": ", payload.status().message()));
      }
      wire::v1::HostKillReply reply;
      if (!reply.ParseFromString(*payload)) return absl::InternalError("malformed HostKillReply");
      absl::Status st = wire::status_from_wire(reply);
      // An agent that let this controller go (it lost it: a partition) has
      // already killed its procs, and may serve another controller now.
      if (st.ok() || st.code() == absl::StatusCode::kFailedPrecondition) return absl::OkStatus();
      return absl::Status(st.code(), absl::StrCat(state_->describe(info), ": ", st.message()));
    }));
  }
  absl::Status result;
  for (auto& f : done) result.Update(f.get());
  return result;
}

}  // namespace castmesh
