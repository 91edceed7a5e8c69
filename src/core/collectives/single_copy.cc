#include "core/collectives/single_copy.h"

#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/log/log.h"
#include "core/platform/platform.h"

namespace castmesh::collectives {
namespace {

std::atomic<bool> refused{false};

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("CASTMESH_SINGLE_COPY");
    return CASTMESH_LINUX_FACILITIES && (v == nullptr || std::string_view(v) != "0");
  }();
  return on && !refused.load(std::memory_order_relaxed);
}

[[maybe_unused]] void stop_offering(const std::string& why) {  // Linux only
  if (!refused.exchange(true)) {
    CASTMESH_LOG_INFO("castmesh-collectives: same-host single copy refused by the kernel ({}); large messages "
                      "between processes of this host go through the transport instead",
                      why);
  }
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

bool single_copy_towards(const ProcId& peer) {
  if (!enabled()) return false;
  return absl::StartsWith(peer, "unix:") || absl::StartsWith(peer, "tcp:127.") ||
         absl::StartsWith(peer, "tcp:[::1]") || absl::StartsWith(peer, "tcp:localhost:");
}

const std::string& host_identity() {
  static const std::string identity = [] {
    char ns[128] = {0};
    const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
    return absl::StrCat(read_first_line("/proc/sys/kernel/random/boot_id"), "/", n > 0 ? std::string(ns, n) : "");
  }();
  return identity;
}

absl::Status read_process_memory(int64_t pid, uint64_t address, void* out, size_t size) {
#if CASTMESH_LINUX_FACILITIES
  size_t done = 0;
  while (done < size) {
    iovec local{static_cast<char*>(out) + done, size - done};
    iovec remote{reinterpret_cast<void*>(address + done), size - done};
    const ssize_t n = ::process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    const int err = n == 0 ? EFAULT : errno;
    if (err == EINTR) continue;
    if (err == ESRCH) return absl::UnavailableError(absl::StrCat("process ", pid, " is gone"));
    if (err == EPERM || err == ENOSYS || err == EACCES) {
      stop_offering(std::strerror(err));
      return absl::PermissionDeniedError(absl::StrCat("process_vm_readv: ", std::strerror(err)));
    }
    return absl::InternalError(absl::StrCat("process_vm_readv from process ", pid, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
#else
  (void)pid, (void)address, (void)out, (void)size;
  return absl::UnimplementedError("single copy needs Linux");
#endif
}

}  // namespace castmesh::collectives
