// castmesh::init and the worker proc's main loop.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>

#include "castmesh/proc_mesh.h"
#include "castmesh/wire/v1/control.pb.h"
#include "core/log/log.h"
#include "core/platform/cpu_binding.h"
#include "core/platform/process.h"
#include "core/proc/controller_lifeline.h"
#include "core/proc/join.h"
#include "core/proc/proc_host.h"
#include "core/proc/remote_supervision.h"
#include "core/proc/worker.h"

namespace castmesh {
namespace proc {
namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

}  // namespace

// Serves as a worker until the controller says Stop, disconnects or dies.
// Returns the process exit code.
int serve_worker(const WorkerLaunch& launch, RuntimeOptions runtime_options) {
  // Die with the controller even if it cannot say goodbye (SIGKILL). The
  // connection loss below covers the rest (e.g. a controller thread other
  // than the one that started us exiting is not a death).
  die_with_controller();
  // Before any thread starts, so that every thread inherits the mask.
  if (const char* cpus = std::getenv(platform::kEnvCpuBind); cpus != nullptr && *cpus != '\0') {
    if (absl::Status bound = platform::bind_this_process(cpus); !bound.ok()) {
      CASTMESH_LOG_WARN("castmesh worker: CPU binding not applied: {}", bound.ToString());
    }
    ::unsetenv(platform::kEnvCpuBind);
  }
  const std::string parent_pid = env_or(kEnvParentPid, "");
  if (!parent_pid.empty() && std::atoll(parent_pid.c_str()) != static_cast<long long>(::getppid())) {
    return 1;  // the controller died before we got here
  }
  // Neither the secret nor worker mode is inherited by our own children,
  // and the secret is not left in memory that /proc/<pid>/environ shows.
  platform::erase_from_environment(kEnvSecret);
  ::unsetenv(kEnvSecretFd);
  ::unsetenv(kEnvBootstrap);
  ::unsetenv(kEnvRendezvous);
  const std::string& bootstrap = launch.controller;
  const int rank = launch.rank;

  std::atomic<int> exit_code{-1};
  auto request_exit = [&exit_code](int code) {
    int expected = -1;
    if (exit_code.compare_exchange_strong(expected, code)) exit_code.notify_all();
  };
  std::atomic<ProcHost*> host_for_failures{nullptr};
  // Failures of actors spawned for another proc go to their spawner; the
  // rest to the caller's handler (or the log).
  runtime_options.on_unhandled_failure = [&host_for_failures, user = std::move(runtime_options.on_unhandled_failure)](
                                             const SupervisionEvent& event) {
    ProcHost* host = host_for_failures.load();
    if (host != nullptr && host->supervision().forward_failure(event)) return;
    if (user) {
      user(event);
    } else {
      CASTMESH_LOG_ERROR("actor {} failed: {}", event.child.to_string(), event.reason.ToString());
    }
  };
  Runtime runtime(runtime_options);
  ProcHostOptions host_options;
  host_options.listen = launch.listen;
  host_options.advertise_host = launch.advertise_host;
  host_options.secret = launch.secret;
  host_options.heartbeat_interval = launch.heartbeat_interval;
  host_options.heartbeat_timeout = launch.heartbeat_timeout;
  host_options.tls = launch.tls;
  auto attached = ProcHost::attach(runtime, host_options);
  if (!attached.ok()) {
    CASTMESH_LOG_ERROR("castmesh worker rank {}: cannot start: {}", rank, attached.status().ToString());
    return 3;
  }
  std::shared_ptr<ProcHost> host = std::move(*attached);
  host_for_failures = host.get();
  host->describe_peer(bootstrap, "controller");
  // Raw pointer: the host outlives its I/O thread, while the shared_ptr
  // variable itself is reset below (racing with a capture by reference).
  ProcHost* self = host.get();
  host->on_control(wire::v1::Stop().GetTypeName(),
                   [&](const ProcId&, uint64_t, const std::string&) { request_exit(0); });
  CASTMESH_LOG_DEBUG("castmesh-proc {}: worker rank {} of {} (pid {}, {}) joining controller {}", host->id(), rank,
                     launch.world_size, ::getpid(), launch.rank_origin, bootstrap);
  absl::Status joined = join_controller(
      *host, bootstrap, rank, launch.world_size, absl::Now() + launch.join_timeout,
      [&request_exit, self](const absl::Status& why) {
        CASTMESH_LOG_INFO("castmesh-proc {}: controller gone ({}); exiting", self->id(), std::string(why.message()));
        request_exit(0);
      });
  if (!joined.ok()) {
    CASTMESH_LOG_ERROR("castmesh worker rank {} ({}): cannot join the controller at {}: {}", rank,
                       launch.rank_origin, bootstrap, joined.ToString());
    runtime.shutdown();
    host_for_failures = nullptr;
    host.reset();
    return 1;
  }
  for (int code = exit_code.load(); code == -1; code = exit_code.load()) exit_code.wait(code);
  CASTMESH_LOG_DEBUG("castmesh-proc {}: worker rank {} stopping", host->id(), rank);
  runtime.shutdown();
  host_for_failures = nullptr;
  host.reset();
  return exit_code.load();
}

}  // namespace proc

bool launched_as_worker() {
  return proc::worker_requested([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

int run_worker(RuntimeOptions runtime_options) {
  absl::StatusOr<proc::WorkerLaunch> launch = proc::worker_launch_from_environment();
  if (!launch.ok()) {
    CASTMESH_LOG_ERROR("castmesh worker: {}", std::string(launch.status().message()));
    return 2;
  }
  return proc::serve_worker(*launch, std::move(runtime_options));
}

void init(int argc, char** argv) {
  platform::record_command_line(argc, argv);
  if (launched_as_worker()) std::exit(run_worker());
}

}  // namespace castmesh
