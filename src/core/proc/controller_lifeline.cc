#include "core/proc/controller_lifeline.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"
#include "core/log/log.h"
#include "core/platform/platform.h"
#include "core/platform/process.h"

#if CASTMESH_LINUX_FACILITIES
#include <sys/prctl.h>
#endif

namespace castmesh::proc {
namespace {

// One thread per process that runs every worker spawn and never exits, so
// that a worker's parent (for PR_SET_PDEATHSIG: the spawning thread) lives
// exactly as long as the controller process. Never destroyed (workers may be
// spawned from exit paths); a child fork()ed without exec makes its own.
class SpawnerThread {
 public:
  // The spawner of this process (a fresh one after fork()).
  static SpawnerThread& of_this_process() {
    static detail::Mutex mu;
    static SpawnerThread* current = nullptr;
    detail::MutexLock lock(mu);
    if (current == nullptr || current->pid_ != ::getpid()) current = new SpawnerThread;  // the old one is the parent's
    return *current;
  }

  // Runs `task` on the spawner thread and returns its result.
  int run(std::function<int()> task) {
    std::packaged_task<int()> packaged(std::move(task));
    std::future<int> result = packaged.get_future();
    {
      detail::MutexLock lock(mu_);
      tasks_.push_back(&packaged);
    }
    cv_.notify_one();
    return result.get();
  }

 private:
  SpawnerThread() : pid_(::getpid()) {
    std::thread([this] {
      platform::set_current_thread_name("castmesh-spawn");
      while (true) {
        std::packaged_task<int()>* task = nullptr;
        {
          detail::MutexLock lock(mu_);
          cv_.wait(lock, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !tasks_.empty(); });
          task = tasks_.front();
          tasks_.pop_front();
        }
        (*task)();
      }
    }).detach();
  }

  const pid_t pid_;
  detail::Mutex mu_;
  detail::CondVar cv_;
  std::deque<std::packaged_task<int()>*> tasks_ ABSL_GUARDED_BY(mu_);  // owned by the callers waiting in run()
};

// posix_spawnp with `inherit_fds` made inheritable in the child only.
int spawn_inheriting(pid_t* pid, char* const argv[], char* const envp[], const std::vector<int>& inherit_fds) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
#if defined(__GLIBC__) || defined(__FreeBSD__)
  // dup2(fd, fd) as a spawn action clears close-on-exec in the child alone
  // (POSIX.1-2024; glibc >= 2.29, FreeBSD >= 13).
  for (int fd : inherit_fds) posix_spawn_file_actions_adddup2(&actions, fd, fd);
#else
  // Elsewhere: inheritable for the moment of the spawn. Spawns are
  // serialised on this thread, so no other worker inherits them.
  for (int fd : inherit_fds) ::fcntl(fd, F_SETFD, 0);
#endif
  // Workers start with no signal blocked, whatever the mask of the thread
  // that first allocated (the spawner thread inherited it).
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
  const int rc = ::posix_spawnp(pid, argv[0], &actions, &attributes, argv, envp);
  posix_spawnattr_destroy(&attributes);
#if !(defined(__GLIBC__) || defined(__FreeBSD__))
  for (int fd : inherit_fds) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
#endif
  posix_spawn_file_actions_destroy(&actions);
  return rc;
}

}  // namespace

absl::StatusOr<pid_t> spawn_worker_process(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                           const std::vector<int>& inherit_fds) {
  if (argv.empty()) return absl::InvalidArgumentError("no worker command");
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int rc = SpawnerThread::of_this_process().run(
      [&] { return spawn_inheriting(&pid, args.data(), envp.data(), inherit_fds); });
  if (rc != 0) return absl::UnavailableError(std::strerror(rc));
  return pid;
}

#if CASTMESH_LINUX_FACILITIES

absl::StatusOr<WorkerLifeline> WorkerLifeline::for_spawning() { return WorkerLifeline(-1); }

void die_with_controller() { ::prctl(PR_SET_PDEATHSIG, SIGKILL); }

#else

namespace {

// The read end of this process's lifeline pipe (close-on-exec; copied for
// each spawn); the write end is held, close-on-exec, until the process ends.
absl::StatusOr<int> lifeline_read_end() {
  static detail::Mutex mu;
  static int read_end = -1;
  detail::MutexLock lock(mu);
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
