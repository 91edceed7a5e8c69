#include "core/collectives/request_state.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"
#include "core/scheduler/futex.h"
#include "core/scheduler/scheduler.h"

namespace castmesh::detail {

namespace {
std::atomic<WaitSpinner> g_spinner{nullptr};
std::atomic<WaitSpinner> g_socket_waiter{nullptr};
}  // namespace

void set_wait_spinner(WaitSpinner spinner) { g_spinner.store(spinner, std::memory_order_release); }
void set_socket_waiter(WaitSpinner waiter) { g_socket_waiter.store(waiter, std::memory_order_release); }

std::shared_ptr<RequestState> RequestState::Done(absl::StatusOr<MessageStatus> result) {
  auto state = std::make_shared<RequestState>();
  state->complete(std::move(result));
  return state;
}

void AnyWaiter::fire() {
  {
    detail::MutexLock lock(mu);
    fired = true;
  }
  cv.notify_all();
}

bool RequestState::complete(absl::StatusOr<MessageStatus> result) {
  std::vector<std::weak_ptr<AnyWaiter>> waiters;
  {
    detail::MutexLock lock(mu_);
    if (done_) return false;
    done_ = true;
    result_ = std::move(result);
    waiters.swap(waiters_);
    done_word_.store(1, std::memory_order_seq_cst);
    if (wake_fd_ >= 0) {  // under mu_: the sleeper may close it once it has unset it
      const uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof(one));
    }
  }
  // Dekker with a spinner's add_sleeper(): it counts itself, then sleeps
  // only while done_word_ is 0.
  if (sleepers_.load(std::memory_order_seq_cst) != 0) detail::futex_wake(&done_word_, INT32_MAX);
  cv_.notify_all();
  for (auto& weak : waiters) {
    if (auto waiter = weak.lock()) waiter->fire();
  }
  return true;
}

absl::StatusOr<MessageStatus> RequestState::wait(absl::Duration timeout) {
  bool waited = false;  // the spinner slept until done or the deadline
  if (!done()) {
    WaitDeadline deadline(timeout);
    if (WaitSpinner spin = g_spinner.load(std::memory_order_acquire); spin != nullptr) {
      waited = spin(*this, deadline, WaitMode::kWait);
    }
    if (WaitSpinner sockets = g_socket_waiter.load(std::memory_order_acquire);
        sockets != nullptr && !waited && !done()) {
      waited = sockets(*this, deadline, WaitMode::kWait);
    }
  }
  detail::MutexLock lock(mu_);
  if (!done_ && waited) {
    return absl::DeadlineExceededError(
        absl::StrCat("operation still pending after ", absl::FormatDuration(timeout)));
  }
  if (!done_) {
    // A pooled actor about to block hands its queued work to other workers,
    // or to a helper when none is left (with mu_ released: that takes the
    // scheduler's locks).
    lock.unlock();
    Scheduler::BlockingScope blocking;
    lock.lock();
    if (!cv_.wait_for(lock, timeout, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; })) {
      return absl::DeadlineExceededError(
          absl::StrCat("operation still pending after ", absl::FormatDuration(timeout)));
    }
  }
  return result_;
}

std::optional<absl::StatusOr<MessageStatus>> RequestState::test() {
  WaitDeadline now(absl::ZeroDuration());  // a look has no deadline to keep
  if (WaitSpinner spin = g_spinner.load(std::memory_order_acquire); spin != nullptr && !done()) {
    (void)spin(*this, now, WaitMode::kLook);
  }
  if (WaitSpinner sockets = g_socket_waiter.load(std::memory_order_acquire); sockets != nullptr && !done()) {
    (void)sockets(*this, now, WaitMode::kLook);
  }
  detail::MutexLock lock(mu_);
  if (!done_) return std::nullopt;
  return result_;
}

void RequestState::set_wake_fd(int fd) {
  detail::MutexLock lock(mu_);
  wake_fd_ = fd;
}

void RequestState::add_waiter(const std::shared_ptr<AnyWaiter>& waiter) {
  {
    detail::MutexLock lock(mu_);
    if (!done_) {
      waiters_.push_back(waiter);
      return;
    }
  }
  waiter->fire();
}

}  // namespace castmesh::detail
