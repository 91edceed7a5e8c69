#include "core/scheduler/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <absl/time/clock.h>

#include <cerrno>
#include <ctime>

namespace castmesh::detail {

bool futex_wait(std::atomic<uint32_t>* word, uint32_t expected, absl::Time deadline) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  timespec ts{};
  timespec* tsp = nullptr;
  if (deadline != absl::InfiniteFuture()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    ts = absl::ToTimespec(left);
    tsp = &ts;
  }
  const long rc = syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, tsp, nullptr, 0);
  if (rc == -1 && errno == ETIMEDOUT) return false;
  return true;
}

void futex_wake(std::atomic<uint32_t>* word, int count) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, count, nullptr, nullptr, 0);
}

}  // namespace castmesh::detail
