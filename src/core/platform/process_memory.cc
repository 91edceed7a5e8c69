#include "core/platform/process_memory.h"

#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"
#include "core/platform/platform.h"

namespace castmesh::platform {
namespace {

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

#if CASTMESH_LINUX_FACILITIES
// One direction of cross-memory attach; `what` names the call in errors.
template <typename Call>
absl::Status copy_with(Call call, const char* what, int64_t pid, uint64_t address, char* local_base, size_t size) {
  size_t done = 0;
  while (done < size) {
    iovec local{local_base + done, size - done};
    iovec remote{reinterpret_cast<void*>(address + done), size - done};
    const ssize_t n = call(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    const int err = n == 0 ? EFAULT : errno;
    if (err == EINTR) continue;
    if (err == ESRCH) return absl::UnavailableError(absl::StrCat("process ", pid, " is gone"));
    if (err == EPERM || err == ENOSYS || err == EACCES) {
      return absl::PermissionDeniedError(absl::StrCat(what, ": ", std::strerror(err)));
    }
    return absl::InternalError(absl::StrCat(what, " with process ", pid, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}
#endif

std::string namespace_link(const char* path) {
  char target[128] = {0};
  const ssize_t n = ::readlink(path, target, sizeof(target) - 1);
  return n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string();
}

// "tcp:HOST:PORT" -> "tcp:HOST:" (the prefix every proc at that host shares); "" otherwise.
std::string tcp_host_prefix(const std::string& address) {
  if (!absl::StartsWith(address, "tcp:")) return "";
  const size_t colon = address.rfind(':');
  return colon <= 4 ? std::string() : address.substr(0, colon + 1);
}

detail::Mutex& own_address_mu() {
  static detail::Mutex mu;
  return mu;
}
std::string& own_tcp_prefix() ABSL_EXCLUSIVE_LOCKS_REQUIRED(own_address_mu()) {
  static std::string prefix;
  return prefix;
}

}  // namespace

std::string namespace_host_identity() {
  return absl::StrCat(read_first_line("/proc/sys/kernel/random/boot_id"), "/", namespace_link("/proc/self/ns/pid"),
                      "/", namespace_link("/proc/self/ns/net"));
}

const std::string& host_identity() {
  static const std::string identity = [] {
    const char* configured = std::getenv(kEnvHostIdentity);
    return configured != nullptr && *configured != '\0' ? std::string(configured) : namespace_host_identity();
  }();
  return identity;
}

void note_this_proc_address(const ProcId& self) {
  std::string prefix = tcp_host_prefix(self);
  detail::MutexLock lock(own_address_mu());
  own_tcp_prefix() = std::move(prefix);
}

bool proc_on_this_host(const ProcId& peer) {
  if (absl::StartsWith(peer, "unix:") || absl::StartsWith(peer, "tcp:127.") || absl::StartsWith(peer, "tcp:[::1]") ||
      absl::StartsWith(peer, "tcp:localhost:")) {
    return true;
  }
  if (!absl::StartsWith(peer, "tcp:")) return false;
  detail::MutexLock lock(own_address_mu());
  const std::string& own = own_tcp_prefix();
  return !own.empty() && absl::StartsWith(peer, own);
}

absl::Status read_process_memory(int64_t pid, uint64_t address, void* out, size_t size) {
#if CASTMESH_LINUX_FACILITIES
  return copy_with(::process_vm_readv, "process_vm_readv", pid, address, static_cast<char*>(out), size);
#else
  (void)pid, (void)address, (void)out, (void)size;
  return absl::UnimplementedError("cross-memory attach needs Linux");
#endif
}

absl::Status write_process_memory(int64_t pid, uint64_t address, const void* in, size_t size) {
#if CASTMESH_LINUX_FACILITIES
  // process_vm_writev reads the local iovec only; the cast matches iovec's type.
  return copy_with(::process_vm_writev, "process_vm_writev", pid, address,
                   const_cast<char*>(static_cast<const char*>(in)), size);
#else
  (void)pid, (void)address, (void)in, (void)size;
  return absl::UnimplementedError("cross-memory attach needs Linux");
#endif
}

}  // namespace castmesh::platform
