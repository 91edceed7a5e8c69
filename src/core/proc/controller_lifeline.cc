#include "core/proc/controller_lifeline.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/log/log.h"
#include "core/platform/platform.h"

#if CASTMESH_LINUX_FACILITIES
#include <sys/prctl.h>
#endif

namespace castmesh::proc {

#if CASTMESH_LINUX_FACILITIES

absl::StatusOr<WorkerLifeline> WorkerLifeline::for_spawning() { return WorkerLifeline(-1); }

void die_with_controller() { ::prctl(PR_SET_PDEATHSIG, SIGKILL); }

#else

namespace {

// The read end of this process's lifeline pipe (close-on-exec; copied for
// each spawn); the write end is held, close-on-exec, until the process ends.
absl::StatusOr<int> lifeline_read_end() {
  static std::mutex mu;
  static int read_end = -1;
  std::lock_guard lock(mu);
  if (read_end >= 0) return read_end;
  int fds[2];
  // pipe2(O_CLOEXEC) is not on every system: between pipe() and fcntl() a
  // process spawned by another thread could inherit the write end (it then
  // only delays the workers' exit until it exits itself).
  if (::pipe(fds) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot create the workers' lifeline pipe: ", std::strerror(errno)));
  }
  ::fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  ::fcntl(fds[1], F_SETFD, FD_CLOEXEC);
  read_end = fds[0];
  return read_end;
}

}  // namespace

absl::StatusOr<WorkerLifeline> WorkerLifeline::for_spawning() {
  absl::StatusOr<int> read_end = lifeline_read_end();
  if (!read_end.ok()) return read_end.status();
  // dup() clears close-on-exec on the copy only; a process another thread
  // spawns meanwhile may inherit it too, which is harmless (a read end).
  const int inherited = ::dup(*read_end);
  if (inherited < 0) {
    return absl::UnavailableError(absl::StrCat("cannot pass the lifeline pipe to workers: ", std::strerror(errno)));
  }
  return WorkerLifeline(inherited);
}

void die_with_controller() {
  const char* value = std::getenv(kEnvLifelineFd);
  int fd = -1;
  if (value == nullptr || !absl::SimpleAtoi(value, &fd) || fd < 0) {
    CASTMESH_LOG_INFO("castmesh worker: no {} from the controller; this worker exits only when its connection "
                      "to the controller is lost",
                      kEnvLifelineFd);
    return;
  }
  ::unsetenv(kEnvLifelineFd);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);  // not passed on to this worker's own children
  std::thread([fd] {
    char byte;
    while (true) {
      const ssize_t n = ::read(fd, &byte, 1);
      if (n > 0 || (n < 0 && errno == EINTR)) continue;
      break;  // end of file (or a broken descriptor): the controller is gone
    }
    ::kill(::getpid(), SIGKILL);
  }).detach();
}

#endif

WorkerLifeline::WorkerLifeline(int inherited_fd) : inherited_fd_(inherited_fd) {
  if (inherited_fd_ >= 0) env_entry_ = absl::StrCat(kEnvLifelineFd, "=", inherited_fd_);
}

WorkerLifeline::WorkerLifeline(WorkerLifeline&& other) noexcept
    : inherited_fd_(other.inherited_fd_), env_entry_(std::move(other.env_entry_)) {
  other.inherited_fd_ = -1;
}

WorkerLifeline::~WorkerLifeline() {
  if (inherited_fd_ >= 0) ::close(inherited_fd_);
}

}  // namespace castmesh::proc
