// RequestState: the completion slot of one non-blocking operation of a
// communicator (castmesh::Request shares it). Completed once, by whichever
// thread finishes the operation (an I/O thread, a sender in this process,
// a collective's worker); waited on by any number of threads.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "castmesh/communicator.h"

namespace castmesh::detail {

// Waits on `cv` (with `lock` held) until `ready()` or `timeout` passes;
// returns ready(). absl::InfiniteDuration() waits for ever.
template <typename Ready>
bool wait_for(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, absl::Duration timeout, Ready ready) {
  if (timeout == absl::InfiniteDuration()) {
    cv.wait(lock, ready);
    return true;
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (!ready()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return ready();
    cv.wait_for(lock, absl::ToChronoNanoseconds(std::min(left, absl::Hours(1))));
  }
  return true;
}

// Wakes one waiter of several requests (Request::wait_any).
struct AnyWaiter {
  std::mutex mu;  // std::mutex: ThreadSanitizer cannot see the system abseil's locks
  std::condition_variable cv;
  bool fired ABSL_GUARDED_BY(mu) = false;
  // Sets `fired` and wakes the waiter.
  void fire();
};

class RequestState {
 public:
  // A pending request.
  RequestState() = default;
  // An already completed one.
  static std::shared_ptr<RequestState> Done(absl::StatusOr<MessageStatus> result);

  // Completes the request; later calls are ignored. True if this call did.
  bool complete(absl::StatusOr<MessageStatus> result);
  // Blocks until complete or `timeout` (kDeadlineExceeded).
  absl::StatusOr<MessageStatus> wait(absl::Duration timeout);
  std::optional<absl::StatusOr<MessageStatus>> test();
  bool done();
  // `waiter` fires when this request completes (at once if it has).
  void add_waiter(const std::shared_ptr<AnyWaiter>& waiter);

 private:
  std::mutex mu_;  // std::mutex: ThreadSanitizer cannot see the system abseil's locks
  std::condition_variable cv_;  // done_ became true
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusOr<MessageStatus> result_ ABSL_GUARDED_BY(mu_) = MessageStatus{};
  std::vector<std::weak_ptr<AnyWaiter>> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace castmesh::detail
