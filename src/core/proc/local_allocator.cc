// LocalAllocator: worker procs started on this machine (fork/exec).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/proc_mesh.h"
#include "core/log/log.h"
#include "core/proc/controller_lifeline.h"
#include "core/proc/join.h"
#include "core/proc/launch_env.h"
#include "core/proc/proc_host.h"
#include "core/proc/proc_mesh_state.h"
#include "core/proc/remote_supervision.h"
#include "core/proc/worker.h"
#include "core/proc/worker_spawn.h"
#include "core/wire/handshake.h"

namespace castmesh {
namespace {

// The pids of the workers started so far, by rank: a join must come from
// the process started for its rank.
struct StartedWorkers {
  detail::Mutex mu;
  std::vector<pid_t> pids ABSL_GUARDED_BY(mu);
};

}  // namespace

LocalAllocator::LocalAllocator(LocalAllocatorOptions options) : options_(std::move(options)) {}

absl::StatusOr<ProcMesh> LocalAllocator::allocate(Runtime& runtime, int procs) {
  absl::StatusOr<Shape> shape = detail::line_shape(procs);
  if (!shape.ok()) return shape.status();
  return allocate(runtime, *shape);
}

absl::StatusOr<ProcMesh> LocalAllocator::allocate(Runtime& runtime, const Shape& requested) {
  absl::StatusOr<Shape> shape = detail::mesh_shape(requested);
  if (!shape.ok()) return shape.status();
  const int procs = static_cast<int>(shape->size());
  if (options_.transport != "unix" && options_.transport != "tcp") {
    return absl::InvalidArgumentError(absl::StrCat("unknown transport '", options_.transport, "' (unix or tcp)"));
  }
  detail::MutexLock allocation(proc::allocation_mutex());
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
  if (options_.on_supervision_event) host->supervision().set_root_failure_handler(options_.on_supervision_event);

  auto started = std::make_shared<StartedWorkers>();
  proc::JoinBoard board(host, procs, [started](const proc::JoinedProc& proc) {
    detail::MutexLock lock(started->mu);
    if (static_cast<size_t>(proc.rank) >= started->pids.size()) {
      // A worker can join before posix_spawn has returned its pid here.
      return absl::UnavailableError(absl::StrCat("the worker of rank ", proc.rank, " is still being started"));
    }
    if (started->pids[proc.rank] == proc.pid) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat("proc ", proc.id, " (", proc::describe_joined(proc),
                                                    ") is not the worker started for rank ", proc.rank));
  });

  // Start the workers.
  absl::StatusOr<std::vector<std::string>> worker_argv =
      options_.worker_argv.empty() ? proc::default_worker_argv() : options_.worker_argv;
  if (!worker_argv.ok()) return worker_argv.status();
  const std::vector<std::string>& argv_strings = *worker_argv;
  absl::StatusOr<proc::WorkerLifeline> lifeline = proc::WorkerLifeline::for_spawning();
  if (!lifeline.ok()) return lifeline.status();
  std::vector<std::string> base_env = proc::inherited_worker_environment();
  for (const auto& [key, value] : options_.worker_env) base_env.push_back(key + "=" + value);
  base_env.push_back(absl::StrCat(proc::kEnvBootstrap, "=", host->id()));
  base_env.push_back(absl::StrCat(proc::kEnvWorldSize, "=", procs));
  base_env.push_back(absl::StrCat(proc::kEnvTransport, "=", options_.transport));
  base_env.push_back(absl::StrCat(proc::kEnvParentPid, "=", ::getpid()));
  if (!lifeline->env_entry().empty()) base_env.push_back(lifeline->env_entry());

  std::vector<pid_t> pids;
  auto fail = [&](absl::Status error) {
    detail::ProcMeshState::reap(pids, std::chrono::milliseconds(0));
    return error;
  };
  for (int rank = 0; rank < procs; ++rank) {
    std::vector<std::string> env = base_env;
    env.push_back(absl::StrCat(proc::kEnvRank, "=", rank));
    absl::StatusOr<pid_t> pid = proc::spawn_worker_with_secret(argv_strings, std::move(env), secret);
    if (!pid.ok()) {
      return fail(absl::UnavailableError(absl::StrCat("cannot start worker rank ", rank, " ('", argv_strings[0],
                                                      "'): ", pid.status().message())));
    }
    pids.push_back(*pid);
    detail::MutexLock lock(started->mu);
    started->pids.push_back(*pid);
  }

  // Wait for every join, a worker's early exit, or the deadline.
  absl::Status joined = board.wait(absl::Now() + options_.join_timeout, [&]() -> absl::Status {
    for (int rank = 0; rank < procs; ++rank) {
      int status = 0;
      if (pids[rank] > 0 && ::waitpid(pids[rank], &status, WNOHANG) == pids[rank]) {
        const pid_t pid = pids[rank];
        pids[rank] = 0;  // reaped: not to be waited for or killed again
        const std::vector<int> missing = board.missing_ranks();
        const bool had_joined = std::find(missing.begin(), missing.end(), rank) == missing.end();
        return absl::UnavailableError(absl::StrCat(
            "worker rank ", rank, " (pid ", pid, ", '", argv_strings[0], "') exited ",
            had_joined ? "after joining, before the mesh was complete" : "before joining", " (",
            WIFEXITED(status) ? absl::StrCat("exit status ", WEXITSTATUS(status))
                              : absl::StrCat("signal ", WTERMSIG(status)),
            ")"));
      }
    }
    return absl::OkStatus();
  });
  if (joined.code() == absl::StatusCode::kDeadlineExceeded) {
    std::vector<std::string> missing;
    for (int rank : board.missing_ranks()) missing.push_back(absl::StrCat("rank ", rank, " (pid ", pids[rank], ")"));
    joined = absl::DeadlineExceededError(absl::StrCat("worker proc(s) ", absl::StrJoin(missing, ", "),
                                                      " started with '", argv_strings[0], "' did not join within ",
                                                      absl::FormatDuration(options_.join_timeout)));
  }
  if (!joined.ok()) {
    std::erase(pids, 0);
    return fail(joined);
  }

  std::vector<ProcInfo> infos;
  for (const auto& proc : board.joined()) {
    infos.push_back(ProcInfo{proc->id, proc->rank, proc->pid, proc->hostname});
    CASTMESH_LOG_DEBUG("castmesh-proc {}: worker {} joined from {}", host->id(), proc::describe_joined(*proc),
                       proc->id);
  }
  // Made while the board still watches: a proc lost in between is known.
  std::shared_ptr<detail::ProcMeshState> state =
      detail::ProcMeshState::create(host, secret, std::move(infos), /*owns_processes=*/true);
  state->mark_gone(board.lost_procs());
  return detail::make_proc_mesh(std::move(state), *std::move(shape));
}

}  // namespace castmesh
