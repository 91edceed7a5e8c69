#include "core/platform/process_memory.h"

#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

}  // namespace

const std::string& host_identity() {
  static const std::string identity = [] {
    char ns[128] = {0};
    const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
    return absl::StrCat(read_first_line("/proc/sys/kernel/random/boot_id"), "/", n > 0 ? std::string(ns, n) : "");
  }();
  return identity;
}

bool proc_on_this_host(const ProcId& peer) {
  return absl::StartsWith(peer, "unix:") || absl::StartsWith(peer, "tcp:127.") ||
         absl::StartsWith(peer, "tcp:[::1]") || absl::StartsWith(peer, "tcp:localhost:");
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
