// The host agent (run_host_agent): a proc listening on TCP whose control
// handlers start, kill and report worker procs for one controller at a
// time. Its procs join the controller directly (as procs started by a
// launcher do, core/proc/join.h); the agent only starts them, passes them
// the secret through a pipe, and ends them when the controller goes.
//
// Threads: the handlers and the peer-lost observer run on the agent's I/O
// thread and never block (spawning is a posix_spawn on the spawner thread);
// a reaper thread collects exited procs; run_host_agent's caller waits for
// shutdown.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/host_mesh.h"
#include "castmesh/wire/v1/host.pb.h"
#include "core/host/host_address.h"
#include "core/host/host_tls.h"
#include "core/log/log.h"
#include "core/platform/cpu_binding.h"
#include "core/platform/process_memory.h"
#include "core/proc/controller_lifeline.h"
#include "core/proc/launch_env.h"
#include "core/proc/proc_host.h"
#include "core/proc/worker_spawn.h"
#include "core/transport/address.h"
#include "core/wire/status_code.h"

namespace castmesh {
namespace host {
namespace {

namespace v1 = wire::v1;

// A proc this agent started, until it is reaped.
struct Child {
  pid_t pid = 0;
  uint32_t rank = 0;
  std::string controller;  // whom it was started for
};

class Agent {
 public:
  Agent(HostAgentOptions options, std::string secret, AgentListen listen, transport::TlsFiles tls)
      : options_(std::move(options)),
        secret_(std::move(secret)),
        listen_(std::move(listen)),
        tls_(std::move(tls)),
        runtime_(runtime_options()) {}

  ~Agent() {
    {
      detail::MutexLock lock(mu_);
      stopping_ = true;
    }
    if (reaper_.joinable()) reaper_.join();
    host_.reset();
    runtime_.shutdown();
  }

  absl::Status start() {
    identity_ = options_.host_identity.empty() ? platform::namespace_host_identity() : options_.host_identity;
    char name[256] = {0};
    hostname_ = ::gethostname(name, sizeof(name) - 1) == 0 ? name : "unknown-host";
    proc::ProcHostOptions host_options;
    host_options.listen = listen_.listen;
    host_options.advertise_host = listen_.advertise_host;
    host_options.secret = secret_;
    host_options.tls = tls_;
    absl::StatusOr<std::shared_ptr<proc::ProcHost>> attached = proc::ProcHost::attach(runtime_, host_options);
    if (!attached.ok()) {
      return absl::Status(attached.status().code(), absl::StrCat("host agent cannot listen at ", listen_.listen, ": ",
                                                                 attached.status().message()));
    }
    host_ = *std::move(attached);
    // The host part of its proc id: what its procs advertise too.
    absl::StatusOr<transport::ChannelAddress> id = transport::parse_channel_address(host_->id());
    if (!id.ok()) return id.status();
    advertise_host_ = id->host;
    host_->on_control(v1::HostAttach().GetTypeName(), [this](const ProcId& peer, uint64_t id, const std::string& p) {
      handle_attach(peer, id, p);
    });
    host_->on_control(v1::HostSpawnProcs().GetTypeName(),
                      [this](const ProcId& peer, uint64_t id, const std::string& p) { handle_spawn(peer, id, p); });
    host_->on_control(v1::HostKillProcs().GetTypeName(),
                      [this](const ProcId& peer, uint64_t id, const std::string& p) { handle_kill(peer, id, p); });
    host_->on_control(v1::HostShutdown().GetTypeName(),
                      [this](const ProcId& peer, uint64_t id, const std::string&) { handle_shutdown(peer, id); });
    host_->add_peer_lost_observer([this](const ProcId& peer, const absl::Status& why) { on_peer_lost(peer, why); });
    reaper_ = std::thread([this] { reap_loop(); });
    CASTMESH_LOG_INFO("castmesh-host {}: host agent of {} up (pid {})", host_->id(), hostname_, ::getpid());
    return absl::OkStatus();
  }

  const std::string& id() const { return host_->id(); }

  // Blocks until a controller asked for shutdown and every proc is reaped.
  void wait_for_shutdown() {
    detail::MutexLock lock(mu_);
    shutdown_cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shutdown_ && children_.empty(); });
  }

 private:
  static RuntimeOptions runtime_options() {
    RuntimeOptions options;
    options.workers = 1;  // the agent runs no actors of its own
    return options;
  }

  std::string controller_label() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return controller_name_.empty() || controller_name_ == controller_
               ? controller_
               : absl::StrCat("'", controller_name_, "' at ", controller_);
  }

  template <typename Reply>
  void answer(const ProcId& peer, uint64_t correlation, Reply& reply) {
    if (absl::Status st = host_->send_control(peer, reply, correlation, /*is_reply=*/true); !st.ok()) {
      CASTMESH_LOG_WARN("castmesh-host {}: cannot answer {}: {}", host_->id(), peer, st.ToString());
    }
  }

  // Whether `peer` is the attached controller; otherwise fills `reply`'s error.
  template <typename Reply>
  bool from_controller(const ProcId& peer, Reply& reply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (controller_ == peer) return true;
    wire::status_to_wire(
        absl::FailedPreconditionError(absl::StrCat(
            "host agent ", host_->id(), " (", hostname_, ") is not attached to ", peer,
            controller_.empty() ? " (no controller is attached)" : absl::StrCat(" but to ", controller_label()))),
        &reply);
    return false;
  }

  void handle_attach(const ProcId& peer, uint64_t correlation, const std::string& payload) {
    v1::HostAttachReply reply;
    v1::HostAttach request;
    if (!request.ParseFromString(payload)) {
      wire::status_to_wire(absl::InvalidArgumentError("malformed HostAttach"), &reply);
      answer(peer, correlation, reply);
      return;
    }
    {
      detail::MutexLock lock(mu_);
      if (shutdown_) {
        wire::status_to_wire(absl::UnavailableError(absl::StrCat("host agent ", host_->id(), " (", hostname_,
                                                                 ") is shutting down")),
                             &reply);
      } else if (!controller_.empty() && controller_ != peer) {
        wire::status_to_wire(
            absl::FailedPreconditionError(absl::StrCat(
                "host agent ", host_->id(), " (", hostname_, ") is attached to controller ", controller_label(),
                " since ", absl::FormatTime("%H:%M:%S", attached_at_, absl::LocalTimeZone()),
                "; an agent serves one controller at a time (stop that controller or call its shutdown())")),
            &reply);
      } else {
        controller_ = peer;
        controller_name_ = request.name();
        attached_at_ = absl::Now();
        if (request.heartbeat_interval_ms() > 0 && request.heartbeat_timeout_ms() > 0) {
          host_->set_peer_heartbeat(peer, absl::Milliseconds(request.heartbeat_interval_ms()),
                                    absl::Milliseconds(request.heartbeat_timeout_ms()));
        }
        reply.set_hostname(hostname_);
        reply.set_host_identity(identity_);
        reply.set_advertise_host(advertise_host_);
        reply.set_pid(::getpid());
        CASTMESH_LOG_INFO("castmesh-host {}: attached to controller {}", host_->id(), controller_label());
      }
    }
    answer(peer, correlation, reply);
  }

  // The environment of one proc of `request`.
  std::vector<std::string> proc_environment(const v1::HostSpawnProcs& request, const v1::HostProcLaunch& launch,
                                            size_t local_index) const {
    // Variables set here replace any the agent itself was started with.
    const std::vector<std::string> ours = {proc::kEnvRendezvous,         proc::kEnvRank,
                                           proc::kEnvWorldSize,          proc::kEnvJoinTimeout,
                                           proc::kEnvAdvertiseHost,      platform::kEnvHostIdentity,
                                           proc::kEnvHeartbeatIntervalMs, proc::kEnvHeartbeatTimeoutMs,
                                           platform::kEnvCpuBind,         proc::kEnvTlsCa,
                                           proc::kEnvTlsCert,             proc::kEnvTlsKey};
    // The request's variables replace the agent's own too (getenv finds the first entry of a name).
    std::vector<std::string> requested;
    for (const v1::HostEnvVar& var : request.env()) requested.push_back(var.name());
    for (const v1::HostEnvVar& var : launch.env()) requested.push_back(var.name());
    std::vector<std::string> env;
    for (std::string& entry : proc::inherited_worker_environment()) {
      auto named = [&](const std::string& name) {
        return entry.size() > name.size() && entry.compare(0, name.size(), name) == 0 && entry[name.size()] == '=';
      };
      const bool replaced = std::any_of(ours.begin(), ours.end(), named) ||
                            std::any_of(requested.begin(), requested.end(), named);
      if (!replaced) env.push_back(std::move(entry));
    }
    for (const v1::HostEnvVar& var : request.env()) env.push_back(absl::StrCat(var.name(), "=", var.value()));
    for (const v1::HostEnvVar& var : launch.env()) env.push_back(absl::StrCat(var.name(), "=", var.value()));
    env.push_back(absl::StrCat(proc::kEnvRendezvous, "=", request.rendezvous()));
    env.push_back(absl::StrCat(proc::kEnvRank, "=", launch.rank()));
    env.push_back(absl::StrCat(proc::kEnvWorldSize, "=", request.world_size()));
    if (request.join_timeout_s() > 0) env.push_back(absl::StrCat(proc::kEnvJoinTimeout, "=", request.join_timeout_s()));
    env.push_back(absl::StrCat(proc::kEnvAdvertiseHost, "=", advertise_host_));
    env.push_back(absl::StrCat(platform::kEnvHostIdentity, "=", identity_));
    if (tls_.enabled()) {
      // The agent's own files, by path: its procs run as its user on its
      // host, and no key material goes into an environment or argv.
      env.push_back(absl::StrCat(proc::kEnvTlsCa, "=", tls_.ca_file));
      env.push_back(absl::StrCat(proc::kEnvTlsCert, "=", tls_.cert_file));
      env.push_back(absl::StrCat(proc::kEnvTlsKey, "=", tls_.key_file));
    }
    if (request.heartbeat_interval_ms() > 0 && request.heartbeat_timeout_ms() > 0) {
      env.push_back(absl::StrCat(proc::kEnvHeartbeatIntervalMs, "=", request.heartbeat_interval_ms()));
      env.push_back(absl::StrCat(proc::kEnvHeartbeatTimeoutMs, "=", request.heartbeat_timeout_ms()));
    }
    if (std::string cpus = platform::cpu_binding_for(request.proc_bind(), local_index); !cpus.empty()) {
      env.push_back(absl::StrCat(platform::kEnvCpuBind, "=", cpus));
    }
    return env;
  }

  void handle_spawn(const ProcId& peer, uint64_t correlation, const std::string& payload) {
    v1::HostSpawnReply reply;
    v1::HostSpawnProcs request;
    detail::MutexLock lock(mu_);
    if (!request.ParseFromString(payload)) {
      wire::status_to_wire(absl::InvalidArgumentError("malformed HostSpawnProcs"), &reply);
    } else if (from_controller(peer, reply)) {
      if (absl::Status valid = platform::check_proc_bind(request.proc_bind()); !valid.ok()) {
        wire::status_to_wire(valid, &reply);
      } else {
        spawn_locked(peer, request, reply);
      }
    }
    answer(peer, correlation, reply);
  }

  void spawn_locked(const ProcId& peer, const v1::HostSpawnProcs& request, v1::HostSpawnReply& reply)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // Where the kernel cannot kill the procs with the agent (no
    // PR_SET_PDEATHSIG), they watch a pipe only the agent holds.
    absl::StatusOr<proc::WorkerLifeline> lifeline = proc::WorkerLifeline::for_spawning();
    if (!lifeline.ok()) {
      wire::status_to_wire(lifeline.status(), &reply);
      return;
    }
    std::vector<pid_t> started;
    for (int i = 0; i < request.procs_size(); ++i) {
      const v1::HostProcLaunch& launch = request.procs(i);
      std::vector<std::string> argv(launch.argv().begin(), launch.argv().end());
      if (argv.empty()) argv.assign(request.argv().begin(), request.argv().end());
      if (argv.empty()) argv = options_.worker_argv;
      absl::StatusOr<pid_t> pid =
          argv.empty() ? absl::FailedPreconditionError(absl::StrCat(
                             "host agent ", host_->id(), " has no worker command of its own (start it from "
                             "Python, castmesh.run_worker_loop_forever, or give the procs a command)"))
                       : spawn_one(argv, proc_environment(request, launch, i), lifeline->env_entry());
      if (!pid.ok()) {
        for (pid_t p : started) ::kill(p, SIGKILL);  // reaped by the reaper
        reply.clear_pids();
        wire::status_to_wire(absl::Status(pid.status().code(),
                                          absl::StrCat("host ", hostname_, " (agent ", host_->id(), ") cannot start rank ",
                                                       launch.rank(), argv.empty() ? "" : absl::StrCat(" ('", argv[0], "')"),
                                                       ": ", pid.status().message())),
                             &reply);
        return;
      }
      started.push_back(*pid);
      children_.push_back(Child{*pid, launch.rank(), peer});
      reply.add_pids(*pid);
    }
    CASTMESH_LOG_DEBUG("castmesh-host {}: started {} proc(s) for {}", host_->id(), started.size(), peer);
  }

  absl::StatusOr<pid_t> spawn_one(const std::vector<std::string>& argv, std::vector<std::string> env,
                                  const std::string& lifeline_entry) {
    if (!lifeline_entry.empty()) env.push_back(lifeline_entry);
    return proc::spawn_worker_with_secret(argv, std::move(env), secret_);
  }

  // SIGKILLs the procs of `controller` (those in `pids`, or all); returns how many.
  uint32_t kill_locked(const std::string& controller, const std::vector<int64_t>& pids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint32_t killed = 0;
    for (const Child& child : children_) {
      if (child.controller != controller) continue;
      if (!pids.empty() && std::find(pids.begin(), pids.end(), child.pid) == pids.end()) continue;
      if (::kill(child.pid, SIGKILL) == 0) ++killed;
    }
    return killed;
  }

  void handle_kill(const ProcId& peer, uint64_t correlation, const std::string& payload) {
    v1::HostKillReply reply;
    v1::HostKillProcs request;
    {
      detail::MutexLock lock(mu_);
      if (!request.ParseFromString(payload)) {
        wire::status_to_wire(absl::InvalidArgumentError("malformed HostKillProcs"), &reply);
      } else if (from_controller(peer, reply)) {
        reply.set_killed(kill_locked(peer, std::vector<int64_t>(request.pids().begin(), request.pids().end())));
      }
    }
    answer(peer, correlation, reply);
  }

  void handle_shutdown(const ProcId& peer, uint64_t correlation) {
    v1::HostKillReply reply;
    {
      detail::MutexLock lock(mu_);
      if (from_controller(peer, reply)) {
        reply.set_killed(kill_locked(peer, {}));
        shutdown_ = true;
        CASTMESH_LOG_INFO("castmesh-host {}: shutdown requested by {}", host_->id(), controller_label());
        shutdown_cv_.notify_all();
      }
    }
    answer(peer, correlation, reply);
  }

  void on_peer_lost(const ProcId& peer, const absl::Status& why) {
    detail::MutexLock lock(mu_);
    if (peer != controller_) return;
    const uint32_t killed = kill_locked(peer, {});
    CASTMESH_LOG_WARN("castmesh-host {}: controller {} lost ({}); killed its {} proc(s); waiting for the next one",
                      host_->id(), controller_label(), std::string(why.message()), killed);
    controller_.clear();
    controller_name_.clear();
  }

  // Reaps exited procs and tells their controller, until the agent stops.
  void reap_loop() {
    for (;;) {
      std::vector<std::pair<Child, int>> exited;
      {
        detail::MutexLock lock(mu_);
        if (stopping_ && children_.empty()) return;
        std::erase_if(children_, [&](const Child& child) {
          int status = 0;
          const pid_t r = ::waitpid(child.pid, &status, WNOHANG);
          if (r == 0) return false;
          exited.emplace_back(child, r == child.pid ? status : 0);
          return true;
        });
        if (!exited.empty()) shutdown_cv_.notify_all();
        if (stopping_) {
          for (const Child& child : children_) ::kill(child.pid, SIGKILL);
        }
      }
      for (const auto& [child, status] : exited) {
        v1::HostProcExited message;
        message.set_pid(child.pid);
        message.set_rank(child.rank);
        message.set_exit_status(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        message.set_signal(WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        (void)host_->send_control(child.controller, message);  // it may be gone: nothing to tell then
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  const HostAgentOptions options_;
  const std::string secret_;
  const AgentListen listen_;
  const transport::TlsFiles tls_;  // empty: no TLS
  Runtime runtime_;
  std::shared_ptr<proc::ProcHost> host_;
  std::string identity_;
  std::string hostname_;
  std::string advertise_host_;
  std::thread reaper_;

  detail::Mutex mu_;
  detail::CondVar shutdown_cv_;
  std::string controller_ ABSL_GUARDED_BY(mu_);       // the attached controller's proc id, or ""
  std::string controller_name_ ABSL_GUARDED_BY(mu_);  // as it named itself
  absl::Time attached_at_ ABSL_GUARDED_BY(mu_);
  std::vector<Child> children_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;  // a controller asked for it
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // the agent is being destroyed
};

}  // namespace
}  // namespace host

absl::Status run_host_agent(HostAgentOptions options) {
  absl::StatusOr<transport::TlsFiles> tls = host::tls_files_of(options.ca, options.cert, options.private_key);
  if (!tls.ok()) return tls.status();
  absl::StatusOr<std::string> secret = host::resolve_mesh_secret(options.secret);
  if (!secret.ok()) return secret.status();
  absl::StatusOr<host::AgentListen> listen = host::parse_agent_address(options.address);
  if (!listen.ok()) return listen.status();
  host::Agent agent(options, *std::move(secret), *std::move(listen), *std::move(tls));
  if (absl::Status started = agent.start(); !started.ok()) return started;
  if (options.on_listening) options.on_listening(agent.id());
  agent.wait_for_shutdown();
  // The shutdown's answer is queued on the controller's connection: let it
  // leave before the endpoint closes (the controller also takes the
  // connection's loss after a shutdown request as done).
  absl::SleepFor(absl::Milliseconds(200));
  return absl::OkStatus();
}

}  // namespace castmesh
