// Starting one worker process: what every allocator that forks workers on
// its own machine shares (the LocalAllocator for its children, a host agent
// for a remote controller's procs). Any thread; spawns are serialised on
// the process's spawner thread (core/proc/controller_lifeline.h).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace castmesh::proc {

// This program again, with the command line it was started with
// (castmesh::init recorded it); argv[0] is this process's executable path
// as platform::executable_path() gives it (on Linux /proc/self/exe, which
// names this program only to this process).
absl::StatusOr<std::vector<std::string>> default_worker_argv();

// This process's environment without the variables that make a process a
// worker or hand it a secret (CASTMESH_BOOTSTRAP, CASTMESH_SECRET, ranks,
// ...), with the settings configured at run time (config::configure) in
// place of their variables: the base every worker's environment is built on.
std::vector<std::string> inherited_worker_environment();

// Starts `argv` with `env` plus CASTMESH_SECRET_FD: a close-on-exec pipe
// holding `secret` that only this worker inherits, so the secret is never
// in an environment or on a command line. Returns the pid, or Unavailable
// with the reason.
absl::StatusOr<pid_t> spawn_worker_with_secret(const std::vector<std::string>& argv, std::vector<std::string> env,
                                               const std::string& secret);

}  // namespace castmesh::proc
