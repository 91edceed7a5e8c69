#include "core/proc/worker_spawn.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/config/settings.h"
#include "core/platform/process.h"
#include "core/proc/controller_lifeline.h"
#include "core/proc/launch_env.h"
#include "core/proc/proc_host.h"

namespace castmesh::proc {
namespace {

// A close-on-exec pipe holding `secret` (the write end already closed): its
// read end, which one worker inherits (CASTMESH_SECRET_FD).
absl::StatusOr<int> secret_pipe(const std::string& secret) {
  int fds[2];
#if defined(__linux__) || defined(__FreeBSD__)
  const int rc = ::pipe2(fds, O_CLOEXEC);
#else
  // No pipe2: a process another thread spawns right now could inherit these
  // ends (it would hold a copy of the secret, as its parent does).
  const int rc = ::pipe(fds);
  if (rc == 0) {
    ::fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    ::fcntl(fds[1], F_SETFD, FD_CLOEXEC);
  }
#endif
  if (rc != 0) return absl::UnavailableError(absl::StrCat("cannot pass the mesh secret to a worker: ", std::strerror(errno)));
  // A secret is far smaller than a pipe's buffer: this write never blocks.
  const ssize_t written = ::write(fds[1], secret.data(), secret.size());
  ::close(fds[1]);
  if (written != static_cast<ssize_t>(secret.size())) {
    ::close(fds[0]);
    return absl::UnavailableError("cannot pass the mesh secret to a worker: short write to its pipe");
  }
  return fds[0];
}

}  // namespace

absl::StatusOr<std::vector<std::string>> default_worker_argv() {
  absl::StatusOr<std::string> executable = platform::executable_path();
  if (!executable.ok()) return executable.status();
  std::vector<std::string> argv = platform::command_line();
  if (argv.empty()) argv.push_back("castmesh-worker");
  argv[0] = *std::move(executable);
  return argv;
}

std::vector<std::string> inherited_worker_environment() {
  static constexpr std::string_view kLaunchVariables[] = {
      "CASTMESH_BOOTSTRAP=",  "CASTMESH_SECRET=",     "CASTMESH_RANK=",         "CASTMESH_WORLD_SIZE=",
      "CASTMESH_TRANSPORT=",  "CASTMESH_PARENT_PID=", "CASTMESH_RENDEZVOUS=",   "CASTMESH_LIFELINE_FD=",
      "CASTMESH_SECRET_FD=",  "CASTMESH_SECRET_FILE="};
  std::vector<std::string> env;
  for (char** e = platform::environment(); *e != nullptr; ++e) {
    std::string_view entry(*e);
    bool launch = false;
    for (std::string_view prefix : kLaunchVariables) launch = launch || entry.starts_with(prefix);
    if (!launch) env.emplace_back(entry);
  }
  return config::with_runtime_config(std::move(env));
}

absl::StatusOr<pid_t> spawn_worker_with_secret(const std::vector<std::string>& argv, std::vector<std::string> env,
                                               const std::string& secret) {
  absl::StatusOr<int> secret_fd = secret_pipe(secret);
  if (!secret_fd.ok()) return secret_fd.status();
  env.push_back(absl::StrCat(kEnvSecretFd, "=", *secret_fd));
  absl::StatusOr<pid_t> pid = spawn_worker_process(argv, env, {*secret_fd});
  ::close(*secret_fd);
  return pid;
}

}  // namespace castmesh::proc
