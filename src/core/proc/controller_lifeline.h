// How a worker proc dies with its controller even when the controller could
// not say goodbye (SIGKILL) and even while the worker's actors are busy. (The
// lost transport connection also stops a worker, but only once its handlers
// return, so a handler that never returns would leave an orphan.)
//
// Linux: the worker asks the kernel for SIGKILL when its parent dies
// (prctl PR_SET_PDEATHSIG). The kernel's "parent" is the *thread* that
// started the worker, so workers are started by spawn_worker_process() from
// one thread that lives as long as the controller process, whichever thread
// allocates (a mesh allocated from a short-lived thread would otherwise lose
// its procs when that thread exits). Elsewhere, and in a CASTMESH_POSIX_FALLBACKS
// build: a pipe whose write end only the controller holds (close-on-exec,
// never written); each worker inherits the read end, and a thread of its own
// blocks reading it: end of file means the controller process is gone, and
// the worker SIGKILLs itself. Limit of the pipe: a child the controller
// fork()s WITHOUT exec also holds the write end, so the workers then live on
// until that child exits too (or until their handlers return, through the
// connection loss). The platform choice is made in controller_lifeline.cc only.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace castmesh::proc {

// Environment variable naming the worker's inherited read end (fallback only).
inline constexpr char kEnvLifelineFd[] = "CASTMESH_LIFELINE_FD";

// Controller side: what the workers of one allocation inherit, alive while
// they are being spawned. Not copyable. Thread: the allocating one.
class WorkerLifeline {
 public:
  // Creates the controller's lifeline on first use (once per process).
  static absl::StatusOr<WorkerLifeline> for_spawning();
  WorkerLifeline(WorkerLifeline&& other) noexcept;
  WorkerLifeline& operator=(WorkerLifeline&&) = delete;
  ~WorkerLifeline();

  // "CASTMESH_LIFELINE_FD=<fd>" to add to each worker's environment, or
  // empty when the platform needs none (Linux).
  const std::string& env_entry() const { return env_entry_; }

 private:
  explicit WorkerLifeline(int inherited_fd);
  int inherited_fd_ = -1;  // a non-close-on-exec copy of the read end, closed when spawning is done
  std::string env_entry_;
};

// Controller side: starts `argv` (argv[0] looked up in PATH) with the
// environment `env` (posix_spawnp) on this process's spawner thread, which
// lives until the process ends. `inherit_fds`: close-on-exec descriptors of
// this process that the new process inherits under the same numbers (and no
// other process spawned meanwhile does). Returns the pid, or Unavailable with
// the reason. Any thread; spawns are serialised.
absl::StatusOr<pid_t> spawn_worker_process(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                           const std::vector<int>& inherit_fds = {});

// Worker side, first thing a worker does: arrange to be SIGKILLed when the
// controller that started it dies. Main thread.
void die_with_controller();

}  // namespace castmesh::proc
