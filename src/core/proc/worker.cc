// castmesh::init and the worker proc's main loop.
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>

#include "castmesh/proc_mesh.h"
#include "castmesh/wire/v1/control.pb.h"
#include "core/log/log.h"
#include "core/proc/proc_host.h"
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
int serve_worker(const std::string& bootstrap, RuntimeOptions runtime_options) {
  // Die with the controller even if it cannot say goodbye (SIGKILL). The
  // connection loss below covers the rest (e.g. a controller thread other
  // than the one that started us exiting is not a death).
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const std::string parent_pid = env_or(kEnvParentPid, "");
  if (!parent_pid.empty() && std::atoll(parent_pid.c_str()) != static_cast<long long>(::getppid())) {
    return 1;  // the controller died before we got here
  }
  const std::string secret = env_or(kEnvSecret, "");
  // Neither the secret nor worker mode is inherited by our own children.
  ::unsetenv(kEnvSecret);
  ::unsetenv(kEnvBootstrap);
  const int rank = std::atoi(env_or(kEnvRank, "0").c_str());
  const std::string transport = env_or(kEnvTransport, "unix");

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
    if (host != nullptr && host->forward_failure(event)) return;
    if (user) {
      user(event);
    } else {
      CASTMESH_LOG_ERROR("actor {} failed: {}", event.child.to_string(), event.reason.ToString());
    }
  };
  Runtime runtime(runtime_options);
  ProcHostOptions host_options;
  host_options.listen = transport == "tcp" ? "tcp:127.0.0.1:0" : "";
  host_options.secret = secret;
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
  host->add_peer_lost_observer([&request_exit, self, bootstrap](const ProcId& peer, const absl::Status& why) {
    if (peer == bootstrap) {
      CASTMESH_LOG_INFO("castmesh-proc {}: controller gone ({}); exiting", self->id(), std::string(why.message()));
      request_exit(0);
    }
  });
  host->on_control(wire::v1::Stop().GetTypeName(),
                   [&](const ProcId&, uint64_t, const std::string&) { request_exit(0); });
  wire::v1::Join join;
  join.set_rank(static_cast<uint32_t>(rank));
  join.set_pid(::getpid());
  if (absl::Status st = host->send_control(bootstrap, join); !st.ok()) {
    CASTMESH_LOG_ERROR("castmesh worker rank {}: cannot reach controller {}: {}", rank, bootstrap, st.ToString());
    return 1;
  }
  CASTMESH_LOG_DEBUG("castmesh-proc {}: worker rank {} (pid {}) joining controller {}", host->id(), rank,
                     ::getpid(), bootstrap);
  for (int code = exit_code.load(); code == -1; code = exit_code.load()) exit_code.wait(code);
  CASTMESH_LOG_DEBUG("castmesh-proc {}: worker rank {} stopping", host->id(), rank);
  runtime.shutdown();
  host_for_failures = nullptr;
  host.reset();
  return exit_code.load();
}

std::vector<std::string>& recorded_argv() {
  static auto* argv = new std::vector<std::string>;
  return *argv;
}

}  // namespace proc

bool launched_as_worker() {
  const char* bootstrap = std::getenv(proc::kEnvBootstrap);
  return bootstrap != nullptr && *bootstrap != '\0';
}

int run_worker(RuntimeOptions runtime_options) {
  if (!launched_as_worker()) {
    CASTMESH_LOG_ERROR("castmesh::run_worker: this process was not started by a LocalAllocator ({} unset)",
                       proc::kEnvBootstrap);
    return 2;
  }
  return proc::serve_worker(std::getenv(proc::kEnvBootstrap), std::move(runtime_options));
}

void init(int argc, char** argv) {
  auto& recorded = proc::recorded_argv();
  recorded.assign(argv, argv + argc);
  if (launched_as_worker()) std::exit(run_worker());
}

}  // namespace castmesh
