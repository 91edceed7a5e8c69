// Mutex, MutexLock, CondVar, SharedMutex: std::mutex and friends with
// clang's thread-safety annotations, so fields marked ABSL_GUARDED_BY(mu_)
// are checked at compile time (clang -Wthread-safety, the fuzz build in CI).
//
// Why not absl::Mutex: the Debian abseil is built without ThreadSanitizer, so
// under TSan its lock handoffs are invisible and every guarded field reads
// as a race. std::mutex is intercepted by TSan everywhere; libstdc++'s is
// not annotated for clang's analysis, hence this thin wrapper (no extra
// state, same cost as std::mutex).
//
// Threading: as std::mutex. Anyone may use them; internal to castmesh.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace castmesh::detail {

// A non-recursive mutex whose lock and unlock clang's analysis can see.
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  // Blocks until the calling thread holds the mutex.
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  // Releases a mutex the calling thread holds.
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // Takes the mutex if no thread holds it (true), without waiting.
  bool try_lock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex for its scope (lock_guard), may release it early or
// re-take it (unique_lock), and is what CondVar waits with.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : lock_(mu.mu_) {}
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Releases the mutex before the end of the scope.
  void unlock() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }
  // Takes the mutex again after unlock().
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { lock_.lock(); }

 private:
  friend class CondVar;
  std::unique_lock<std::mutex> lock_;
};

// A reader-writer mutex (std::shared_mutex) the analysis can see: many
// readers (ReaderMutexLock) or one writer (WriterMutexLock).
class ABSL_LOCKABLE SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  // Blocks until the calling thread is the only holder.
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  // Releases an exclusive hold.
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // Blocks until the calling thread holds it shared (no writer holds it).
  void lock_shared() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  // Releases a shared hold.
  void unlock_shared() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }

 private:
  friend class ReaderMutexLock;
  std::shared_mutex mu_;
};

// Holds a SharedMutex shared for its scope (or until unlock()).
class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex& mu) ABSL_SHARED_LOCK_FUNCTION(mu) : lock_(mu.mu_) {}
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() {}
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

  // Releases the shared hold before the end of the scope.
  void unlock() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }

 private:
  std::shared_lock<std::shared_mutex> lock_;
};

// Holds a SharedMutex exclusively for its scope.
class ABSL_SCOPED_LOCKABLE WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_.lock(); }
  ~WriterMutexLock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex& mu_;
};

// A condition variable used with MutexLock. A predicate that reads guarded
// fields is annotated ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) (it runs under the
// lock; the analysis cannot see into the wait).
class CondVar {
 public:
  // Waits (releasing the lock meanwhile) until notified; may wake spuriously.
  void wait(MutexLock& lock) { cv_.wait(lock.lock_); }
  // Waits until `ready()` holds.
  template <typename Predicate>
  void wait(MutexLock& lock, Predicate ready) {
    cv_.wait(lock.lock_, std::move(ready));
  }
  // Waits until `ready()` holds or `timeout` passes; returns ready().
  // absl::InfiniteDuration() waits for ever.
  // (Unchecked inside: `ready` needs the caller's lock, which the analysis
  // cannot connect to `lock`.)
  template <typename Predicate>
  bool wait_for(MutexLock& lock, absl::Duration timeout, Predicate ready) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (timeout == absl::InfiniteDuration()) {
      cv_.wait(lock.lock_, std::move(ready));
      return true;
    }
    // A deadline, not one long wait: a wait may wake spuriously, and the
    // hour cap keeps huge timeouts clear of chrono overflow.
    const absl::Time deadline = absl::Now() + timeout;
    while (!ready()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return ready();
      cv_.wait_for(lock.lock_, absl::ToChronoNanoseconds(std::min(left, absl::Hours(1))));
    }
    return true;
  }
  // Waits until notified or `timeout` passes (may wake spuriously).
  void wait_for(MutexLock& lock, absl::Duration timeout) {
    cv_.wait_for(lock.lock_, absl::ToChronoNanoseconds(std::min(timeout, absl::Hours(1))));
  }
  // Waits until notified or `deadline` passes (may wake spuriously).
  template <typename Clock, typename Duration>
  std::cv_status wait_until(MutexLock& lock, const std::chrono::time_point<Clock, Duration>& deadline) {
    return cv_.wait_until(lock.lock_, deadline);
  }
  // Wakes one waiter.
  void notify_one() noexcept { cv_.notify_one(); }
  // Wakes every waiter.
  void notify_all() noexcept { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace castmesh::detail
