// RequestState: the completion slot of one non-blocking operation of a
// communicator (castmesh::Request shares it). Completed once, by whichever
// thread finishes the operation (an I/O thread, a sender in this process,
// a collective's worker); waited on by any number of threads.
#pragma once

#include <algorithm>
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

// Drives progress that needs the waiting thread itself (shared-memory
// rings, core/collectives/shm_path.h): called by wait() before it sleeps,
// it spins a bounded time (never past `deadline`), returning early once
// `done()` is true. Set once a ring is up; any thread.
using WaitSpinner = void (*)(const std::function<bool()>& done, absl::Time deadline);
void set_wait_spinner(WaitSpinner spinner);

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
  detail::Mutex mu_;
  detail::CondVar cv_;  // done_ became true
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusOr<MessageStatus> result_ ABSL_GUARDED_BY(mu_) = MessageStatus{};
  std::vector<std::weak_ptr<AnyWaiter>> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace castmesh::detail
