// RequestState: the completion slot of one data-plane operation (a
// communicator's send, receive or collective; castmesh::Request shares it).
// Completed once, by whichever thread finishes the operation (an I/O
// thread, a sender in this process, a progress worker); waited on by any
// number of threads, through the progress engine.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "castmesh/communicator.h"
#include "castmesh/detail/mutex.h"

namespace castmesh::detail {

// Wakes one waiter of several requests (Request::wait_any).
struct AnyWaiter {
  detail::Mutex mu;
  detail::CondVar cv;
  bool fired ABSL_GUARDED_BY(mu) = false;
  // Sets `fired` and wakes the waiter.
  void fire();
};

// A wait's deadline, read from the clock only when a waiter first needs it:
// a wait whose answer is there at the first look never reads the clock
// (which costs tens of nanoseconds on a VM). Used by one waiting thread.
class WaitDeadline {
 public:
  explicit WaitDeadline(absl::Duration timeout) : timeout_(timeout) {}
  // The deadline, fixed as `now` + the timeout the first time it is asked.
  absl::Time at(absl::Time now) {
    if (!fixed_) {
      at_ = timeout_ == absl::InfiniteDuration() ? absl::InfiniteFuture() : now + timeout_;
      fixed_ = true;
    }
    return at_;
  }
  absl::Time at() { return fixed_ ? at_ : at(absl::Now()); }

 private:
  absl::Duration timeout_;
  absl::Time at_;
  bool fixed_ = false;
};
class RequestState {
 public:
  // A pending request.
  RequestState() = default;
  // An already completed one.
  static std::shared_ptr<RequestState> Done(absl::StatusOr<MessageStatus> result);

  // Completes the request; later calls are ignored. True if this call did.
  // Any thread. Takes no lock unless a wait_any or a socket waiter listens.
  bool complete(absl::StatusOr<MessageStatus> result);
  // Blocks until complete or `timeout` (kDeadlineExceeded), moving bytes
  // meanwhile through the progress engine (progress_engine.h). The caller's thread.
  absl::StatusOr<MessageStatus> wait(absl::Duration timeout);
  // The result if complete (after one look at the engine's wait sources),
  // nullopt while pending. Never blocks.
  std::optional<absl::StatusOr<MessageStatus>> test();
  // The result; only after done() returned true.
  const absl::StatusOr<MessageStatus>& result() const { return result_; }
  // Whether complete() ran (no lock; seq_cst, as the listeners' Dekker
  // handshakes with complete() need).
  bool done() { return done_word_.load(std::memory_order_seq_cst) != 0; }
  // 0 until complete(), then 1: a private futex word that waiters sleep on
  // between add_sleeper() and remove_sleeper() (complete() wakes it then).
  // Any thread.
  std::atomic<uint32_t>* done_word() { return &done_word_; }
  void add_sleeper() { sleepers_.fetch_add(1, std::memory_order_seq_cst); }
  void remove_sleeper() { sleepers_.fetch_sub(1, std::memory_order_relaxed); }
  // `waiter` fires when this request completes (at once if it has).
  void add_waiter(const std::shared_ptr<AnyWaiter>& waiter);
  // An eventfd that complete() writes, for a thread asleep in poll() on it
  // (the socket waiter), or -1 for none. Any thread; after set_wake_fd(-1)
  // returns, complete() no longer touches the old one.
  void set_wake_fd(int fd);

 private:
  // Fires the wait_any waiters and writes the wake fd (each at most once).
  void notify_listeners();

  // The first complete() claims the request, writes result_ and then sets
  // done_word_ (seq_cst): result_ is read only after done() saw that, and
  // never written again, so waiters read it without a lock.
  std::atomic<bool> claimed_{false};
  absl::StatusOr<MessageStatus> result_ = MessageStatus{};
  std::atomic<uint32_t> done_word_{0};
  std::atomic<uint32_t> sleepers_{0};  // threads asleep on done_word_
  // Set (seq_cst, never cleared) once a wait_any waiter or a wake fd was
  // registered: only then does complete() take mu_.
  std::atomic<bool> listeners_{false};
  detail::Mutex mu_;
  std::vector<std::weak_ptr<AnyWaiter>> waiters_ ABSL_GUARDED_BY(mu_);
  int wake_fd_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace castmesh::detail
