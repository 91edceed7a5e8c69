// Blocking on a 32-bit atomic word without polling. Used to park idle
// workers and threads waiting on futures, so a wake-up is one system call and
// an idle runtime burns no CPU. Any thread.
// On Linux this is the futex system call; elsewhere, and in a
// CASTMESH_POSIX_FALLBACKS build, the portable parking lot (parking_lot.h)
// with the same contract. The choice is made in futex.cc only.
#pragma once

#include <absl/time/time.h>

#include <atomic>
#include <cstdint>

namespace castmesh::detail {

// Sleeps while *word == expected, until woken or `deadline`. Returns false
// when the deadline passed. Spurious returns are possible; re-check.
bool futex_wait(std::atomic<uint32_t>* word, uint32_t expected, absl::Time deadline);
// Wakes up to `count` threads sleeping on `word`.
void futex_wake(std::atomic<uint32_t>* word, int count);

// The same on a word in memory shared between processes (a mapped
// segment): the kernel keys the sleeper by physical page, not by this
// process's address space. Without Linux futexes (other POSIX systems, a
// CASTMESH_POSIX_FALLBACKS build) the wait polls the word with a backoff of
// short sleeps (up to 1 ms) and the wake does nothing.
bool futex_wait_shared(std::atomic<uint32_t>* word, uint32_t expected, absl::Time deadline);
void futex_wake_shared(std::atomic<uint32_t>* word, int count);

// One word of a futex_wait_any: sleep while *word == expected; `shared` for a
// word in memory mapped by several processes (woken by futex_wake_shared),
// else a word of this process (woken by futex_wake).
struct FutexWaitItem {
  std::atomic<uint32_t>* word;
  uint32_t expected;
  bool shared;
};
// What futex_wait_any did.
enum class FutexWaitAny { kWoken, kTimedOut, kUnsupported };
// Sleeps until one of `items` (at most kFutexWaitAnyMax) is woken or no
// longer holds its expected value, or `deadline`: one system call and one
// wake-up for several words (Linux 5.16's futex_waitv). kUnsupported, at
// once, where the kernel or the platform lacks it (the caller sleeps some
// other way). Spurious kWoken returns are possible; re-check.
inline constexpr int kFutexWaitAnyMax = 128;
FutexWaitAny futex_wait_any(const FutexWaitItem* items, int count, absl::Time deadline);

// A full store-load barrier (Dekker-style handshakes between a thread that
// publishes work and one that announces it is going to sleep). ThreadSanitizer
// does not model fences, so under TSan every caller does a seq_cst RMW on one
// shared word instead, which orders the two sides the same way.
#if defined(__SANITIZE_THREAD__)
inline std::atomic<uint32_t> g_barrier_word{0};
inline void store_load_barrier() { g_barrier_word.fetch_add(0, std::memory_order_seq_cst); }
#else
inline void store_load_barrier() { std::atomic_thread_fence(std::memory_order_seq_cst); }
#endif

// Spin hint for short busy-waits.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace castmesh::detail
