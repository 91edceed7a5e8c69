#include "core/collectives/request_state.h"

#include "absl/strings/str_cat.h"
#include "core/scheduler/scheduler.h"

namespace castmesh::detail {

std::shared_ptr<RequestState> RequestState::Done(absl::StatusOr<MessageStatus> result) {
  auto state = std::make_shared<RequestState>();
  state->complete(std::move(result));
  return state;
}

bool RequestState::complete(absl::StatusOr<MessageStatus> result) {
  std::vector<std::weak_ptr<AnyWaiter>> waiters;
  {
    absl::MutexLock lock(&mu_);
    if (done_) return false;
    done_ = true;
    result_ = std::move(result);
    waiters.swap(waiters_);
  }
  for (auto& weak : waiters) {
    if (auto waiter = weak.lock()) {
      absl::MutexLock lock(&waiter->mu);
      waiter->fired = true;
    }
  }
  return true;
}

absl::StatusOr<MessageStatus> RequestState::wait(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!done_) {
    // A pooled actor about to block hands its queued work to other workers.
    Scheduler::before_blocking_on_this_thread();
    auto is_done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return done_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&is_done), timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("operation still pending after ", absl::FormatDuration(timeout)));
    }
  }
  return result_;
}

std::optional<absl::StatusOr<MessageStatus>> RequestState::test() {
  absl::MutexLock lock(&mu_);
  if (!done_) return std::nullopt;
  return result_;
}

bool RequestState::done() {
  absl::MutexLock lock(&mu_);
  return done_;
}

void RequestState::add_waiter(const std::shared_ptr<AnyWaiter>& waiter) {
  {
    absl::MutexLock lock(&mu_);
    if (!done_) {
      waiters_.push_back(waiter);
      return;
    }
  }
  absl::MutexLock lock(&waiter->mu);
  waiter->fired = true;
}

}  // namespace castmesh::detail
