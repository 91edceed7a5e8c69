#include "core/transport/unix_socket_names.h"

#include <dirent.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "castmesh/detail/mutex.h"
#include "core/platform/platform.h"
#include "core/transport/address.h"
#include "core/wire/handshake.h"

namespace castmesh::transport {
namespace {

#if !CASTMESH_LINUX_FACILITIES
// "<pid>-<12 hex digits>": unique enough with the pid, short for sun_path.
std::string unique_socket_name() {
  return absl::StrCat(::getpid(), "-", absl::BytesToHexString(wire::make_nonce().substr(0, 6)));
}
#endif

// Longest socket file name this system takes (sun_path, with its NUL).
constexpr size_t kMaxSocketPath = sizeof(sockaddr_un{}.sun_path) - 1;
// What unique_socket_name() and its '/' may add to the folder's path.
constexpr size_t kSocketNameRoom = 1 + 10 + 1 + 12;

// Makes (or checks) `folder` as a private folder of this user.
absl::Status make_private_folder(const std::string& folder) {
  if (::mkdir(folder.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::UnavailableError(absl::StrCat("cannot create the socket folder ", folder, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (::lstat(folder.c_str(), &st) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot inspect the socket folder ", folder, ": ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing the socket folder ", folder, ": it is not a private folder of this user (",
        S_ISDIR(st.st_mode) ? "" : "not a folder, ", "owner uid ", st.st_uid, ", mode ",
        absl::StrFormat("%04o", st.st_mode & 0777), "); remove it, or set TMPDIR to a folder of your own"));
  }
  return absl::OkStatus();
}

// Removes the socket files of procs that were killed before they could
// unlink them: names "<pid>-..." (ours) whose pid is gone here AND where
// nobody listens (a proc in another pid namespace sharing this folder may
// look gone but still answers). Returns how many were removed.
int sweep_dead_sockets(const std::string& folder) {
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) return 0;
  int removed = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    const size_t dash = name.find('-');
    long pid = 0;
    if (dash == std::string::npos || dash == 0 || dash > 10 ||
        !absl::SimpleAtoi(absl::string_view(name).substr(0, dash), &pid) || pid <= 0) {
      continue;
    }
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    const std::string path = absl::StrCat(folder, "/", name);
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode) || path.size() > kMaxSocketPath) continue;
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, path.data(), path.size());
    const int probe = ::socket(AF_UNIX, SOCK_STREAM, 0);
    if (probe < 0) continue;
    const bool refused = ::connect(probe, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 && errno == ECONNREFUSED;
    ::close(probe);
    if (refused && ::unlink(path.c_str()) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

}  // namespace

bool abstract_unix_sockets_supported() { return CASTMESH_LINUX_FACILITIES != 0; }

absl::StatusOr<std::string> private_socket_folder_in(const std::vector<std::string>& bases) {
  const std::string leaf = absl::StrCat("castmesh-", ::geteuid());
  std::string first_error;
  for (std::string base : bases) {
    while (base.size() > 1 && base.back() == '/') base.pop_back();
    if (base.empty() || base[0] != '/') continue;
    const std::string folder = absl::StrCat(base == "/" ? "" : base, "/", leaf);
    if (folder.size() + kSocketNameRoom > kMaxSocketPath) {
      if (first_error.empty()) {
        first_error = absl::StrCat(folder, " is too long for socket paths (at most ", kMaxSocketPath,
                                   " bytes on this system)");
      }
      continue;
    }
    absl::Status st = make_private_folder(folder);
    if (st.ok()) {
      (void)sweep_dead_sockets(folder);
      return folder;
    }
    if (first_error.empty()) first_error = std::string(st.message());
  }
  if (first_error.empty()) first_error = "no absolute folder given";
  return absl::UnavailableError(absl::StrCat("no folder for Unix socket files: ", first_error));
}

absl::StatusOr<std::string> private_socket_folder() {
  static detail::Mutex mu;
  static std::string made;  // once made, for the life of the process
  detail::MutexLock lock(mu);
  if (!made.empty()) return made;
  const char* tmpdir = std::getenv("TMPDIR");
  absl::StatusOr<std::string> folder = private_socket_folder_in({tmpdir != nullptr ? tmpdir : "", "/tmp"});
  if (folder.ok()) made = *folder;
  return folder;
}

absl::StatusOr<std::string> unique_unix_listen_address() {
#if CASTMESH_LINUX_FACILITIES
  return unique_abstract_unix_address();
#else
  absl::StatusOr<std::string> folder = private_socket_folder();
  if (!folder.ok()) return folder.status();
  return absl::StrCat("unix:", *folder, "/", unique_socket_name());
#endif
}

std::optional<long> unix_peer_pid(int fd) {
#if CASTMESH_LINUX_FACILITIES
  ucred cred{};
  socklen_t size = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &size) == 0) return cred.pid;
#elif defined(__APPLE__) && defined(LOCAL_PEERPID)
  pid_t pid = 0;
  socklen_t size = sizeof(pid);
  if (::getsockopt(fd, SOL_LOCAL, LOCAL_PEERPID, &pid, &size) == 0) return pid;
#else
  (void)fd;  // POSIX has no call for the peer's pid
#endif
  return std::nullopt;
}

}  // namespace castmesh::transport
