#include "core/scheduler/parking_lot.h"

#include <absl/time/clock.h>

#include <chrono>

#include "castmesh/detail/mutex.h"

namespace castmesh::detail {
namespace {

// One parked thread, on its own stack; linked while it waits.
struct Waiter {
  const void* word = nullptr;
  detail::CondVar cv;
  bool woken = false;  // set (under the bucket mutex) by the waker that unlinked it
  Waiter* prev = nullptr;
  Waiter* next = nullptr;
};

struct alignas(64) Bucket {
  detail::Mutex mu;
  Waiter* head ABSL_GUARDED_BY(mu) = nullptr;  // oldest
  Waiter* tail ABSL_GUARDED_BY(mu) = nullptr;

  void link(Waiter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    w->prev = tail;
    w->next = nullptr;
    (tail != nullptr ? tail->next : head) = w;
    tail = w;
  }
  void unlink(Waiter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    (w->prev != nullptr ? w->prev->next : head) = w->next;
    (w->next != nullptr ? w->next->prev : tail) = w->prev;
  }
};

// A power of two; collisions only cost a longer list walk, never a wrong wake.
constexpr size_t kBuckets = 256;

Bucket& bucket_of(const void* word) {
  static auto* buckets = new Bucket[kBuckets];  // never destroyed: threads may park during exit
  // Fibonacci hashing of the address; the low bits are mostly alignment.
  const auto a = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(word));
  return buckets[(a * 0x9E3779B97F4A7C15ull) >> (64 - 8)];
}
static_assert(kBuckets == 1u << 8);

// Longer waits are cut to this (a spurious return, which callers allow), so
// that steady_clock::now() + wait cannot overflow.
constexpr absl::Duration kLongestWait = absl::Hours(24);

}  // namespace

bool parking_lot_wait(std::atomic<uint32_t>* word, uint32_t expected, absl::Time deadline) {
  const bool forever = deadline == absl::InfiniteFuture();
  absl::Duration left = absl::InfiniteDuration();
  if (!forever) {
    left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
  }
  const bool cut = left > kLongestWait;
  const auto until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(cut ? kLongestWait : left);
  Bucket& bucket = bucket_of(word);
  detail::MutexLock lock(bucket.mu);
  if (word->load(std::memory_order_seq_cst) != expected) return true;
  Waiter me;
  me.word = word;
  bucket.link(&me);
  while (!me.woken) {
    if (me.cv.wait_until(lock, until) == std::cv_status::timeout && !me.woken) {
      bucket.unlink(&me);
      return cut;  // a cut wait is a spurious return, not a timeout
    }
  }
  return true;  // the waker unlinked us
}

int parking_lot_wake(const void* word, int count) {
  Bucket& bucket = bucket_of(word);
  detail::MutexLock lock(bucket.mu);
  int woken = 0;
  for (Waiter* w = bucket.head; w != nullptr && woken < count;) {
    Waiter* next = w->next;
    if (w->word == word) {
      bucket.unlink(w);
      w->woken = true;
      // Under the mutex: once it is released the woken thread may return
      // and destroy its condition variable.
      w->cv.notify_one();
      ++woken;
    }
    w = next;
  }
  return woken;
}

size_t parking_lot_parked(const void* word) {
  Bucket& bucket = bucket_of(word);
  detail::MutexLock lock(bucket.mu);
  size_t parked = 0;
  for (const Waiter* w = bucket.head; w != nullptr; w = w->next) parked += w->word == word ? 1 : 0;
  return parked;
}

}  // namespace castmesh::detail
