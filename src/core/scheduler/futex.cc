#include "core/scheduler/futex.h"

#include "core/platform/platform.h"

#if CASTMESH_LINUX_FACILITIES
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <absl/time/clock.h>

#include <atomic>
#include <cerrno>
#include <ctime>
#else
#include <absl/time/clock.h>

#include <algorithm>

#include "core/scheduler/parking_lot.h"
#endif

namespace castmesh::detail {

#if CASTMESH_LINUX_FACILITIES

namespace {
// FUTEX_WAIT with `op` (private or shared); false when the deadline passed.
bool futex_wait_op(std::atomic<uint32_t>* word, uint32_t expected, absl::Time deadline, int op) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  timespec ts{};
  timespec* tsp = nullptr;
  if (deadline != absl::InfiniteFuture()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    ts = absl::ToTimespec(left);
    tsp = &ts;
  }
  const long rc = syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, expected, tsp, nullptr, 0);
  if (rc == -1 && errno == ETIMEDOUT) return false;
  return true;
}
}  // namespace

bool futex_wait(std::atomic<uint32_t>* word, uint32_t expected, absl::Time deadline) {
  return futex_wait_op(word, expected, deadline, FUTEX_WAIT_PRIVATE);
}

void futex_wake(std::atomic<uint32_t>* word, int count) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, count, nullptr, nullptr, 0);
}

bool futex_wait_shared(std::atomic<uint32_t>* word, uint32_t expected, absl::Time deadline) {
  return futex_wait_op(word, expected, deadline, FUTEX_WAIT);
}

void futex_wake_shared(std::atomic<uint32_t>* word, int count) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, count, nullptr, nullptr, 0);
}

namespace {
#ifndef __NR_futex_waitv
#define __NR_futex_waitv 449  // the same number on every architecture (added in 5.16)
#endif
// The kernel's struct futex_waitv, declared here so older headers build.
struct WaitvItem {
  uint64_t val;
  uint64_t uaddr;
  uint32_t flags;
  uint32_t reserved;
};
constexpr uint32_t kFutexSize32 = 2;       // FUTEX_32
constexpr uint32_t kFutexPrivate = 128;    // FUTEX_PRIVATE_FLAG
std::atomic<bool> g_waitv_missing{false};  // ENOSYS seen once: never try again
}  // namespace

FutexWaitAny futex_wait_any(const FutexWaitItem* items, int count, absl::Time deadline) {
  if (count <= 0 || count > kFutexWaitAnyMax || g_waitv_missing.load(std::memory_order_relaxed)) {
    return FutexWaitAny::kUnsupported;
  }
  WaitvItem waiters[kFutexWaitAnyMax];
  for (int i = 0; i < count; ++i) {
    waiters[i] = {items[i].expected, reinterpret_cast<uint64_t>(items[i].word),
                  kFutexSize32 | (items[i].shared ? 0 : kFutexPrivate), 0};
  }
  // futex_waitv takes an absolute time on the clock it is given.
  timespec abs{};
  timespec* absp = nullptr;
  if (deadline != absl::InfiniteFuture()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return FutexWaitAny::kTimedOut;
    timespec now{};
    clock_gettime(CLOCK_MONOTONIC, &now);
    abs = absl::ToTimespec(absl::DurationFromTimespec(now) + left);
    absp = &abs;
  }
  const long rc = syscall(__NR_futex_waitv, waiters, count, 0, absp, CLOCK_MONOTONIC);
  if (rc >= 0) return FutexWaitAny::kWoken;
  switch (errno) {
    case ETIMEDOUT:
      return FutexWaitAny::kTimedOut;
    case ENOSYS:
    case EPERM:  // a seccomp filter that refuses unknown system calls
      g_waitv_missing.store(true, std::memory_order_relaxed);
      return FutexWaitAny::kUnsupported;
    default:  // EAGAIN (a word already changed), EINTR
      return FutexWaitAny::kWoken;
  }
}

#else

FutexWaitAny futex_wait_any(const FutexWaitItem*, int, absl::Time) { return FutexWaitAny::kUnsupported; }

bool futex_wait(std::atomic<uint32_t>* word, uint32_t expected, absl::Time deadline) {
  return parking_lot_wait(word, expected, deadline);
}

void futex_wake(std::atomic<uint32_t>* word, int count) { (void)parking_lot_wake(word, count); }

// The parking lot is per process: another process's wake cannot reach it,
// so the sleeper polls the word.
bool futex_wait_shared(std::atomic<uint32_t>* word, uint32_t expected, absl::Time deadline) {
  absl::Duration nap = absl::Microseconds(20);
  while (word->load(std::memory_order_acquire) == expected) {
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    absl::SleepFor(std::min(nap, deadline - now));
    nap = std::min(nap * 2, absl::Milliseconds(1));
  }
  return true;
}

void futex_wake_shared(std::atomic<uint32_t>*, int) {}

#endif

}  // namespace castmesh::detail
