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
  if (claimed_.exchange(true, std::memory_order_acq_rel)) return false;
  result_ = std::move(result);
  done_word_.store(1, std::memory_order_seq_cst);
  // Dekker with add_sleeper() and with the listeners' registration: each
  // side announces itself, then looks at the other; whichever looks second
  // sees the other.
  if (listeners_.load(std::memory_order_seq_cst)) notify_listeners();
  if (sleepers_.load(std::memory_order_seq_cst) != 0) detail::futex_wake(&done_word_, INT32_MAX);
  return true;
}

void RequestState::notify_listeners() {
  std::vector<std::weak_ptr<AnyWaiter>> waiters;
  {
    detail::MutexLock lock(mu_);
    waiters.swap(waiters_);
    if (wake_fd_ >= 0) {  // under mu_: the sleeper may close it once it has unset it
      const uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof(one));
    }
  }
  for (auto& weak : waiters) {
    if (auto waiter = weak.lock()) waiter->fire();
  }
}

absl::StatusOr<MessageStatus> RequestState::wait(absl::Duration timeout) {
  if (done()) return result_;
  WaitDeadline deadline(timeout);
  bool waited = false;  // the spinner slept until done or the deadline
  if (WaitSpinner spin = g_spinner.load(std::memory_order_acquire); spin != nullptr) {
    waited = spin(*this, deadline, WaitMode::kWait);
  }
  if (WaitSpinner sockets = g_socket_waiter.load(std::memory_order_acquire);
      sockets != nullptr && !waited && !done()) {
    waited = sockets(*this, deadline, WaitMode::kWait);
  }
  if (!done()) {
    auto still_pending = [&] {
      return absl::DeadlineExceededError(
          absl::StrCat("operation still pending after ", absl::FormatDuration(timeout)));
    };
    if (waited) return still_pending();
    // A pooled actor about to block hands its queued work to other workers,
    // or to a helper when none is left.
    Scheduler::BlockingScope blocking;
    const absl::Time until = deadline.at();
    while (!done()) {
      add_sleeper();
      // futex_wait re-reads the word: a complete() that saw no sleeper
      // stored done_word_ first, so the sleep does not start.
      const bool woken = detail::futex_wait(&done_word_, 0, until);
      remove_sleeper();
      if (!woken && !done()) return still_pending();
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
  if (!done()) return std::nullopt;
  return result_;
}

void RequestState::set_wake_fd(int fd) {
  detail::MutexLock lock(mu_);
  wake_fd_ = fd;
  if (fd >= 0) listeners_.store(true, std::memory_order_seq_cst);
}

void RequestState::add_waiter(const std::shared_ptr<AnyWaiter>& waiter) {
  {
    detail::MutexLock lock(mu_);
    waiters_.push_back(waiter);
    listeners_.store(true, std::memory_order_seq_cst);
  }
  // complete() may have looked at listeners_ before we set it; firing twice
  // is harmless (notify_listeners hands each registration out once).
  if (done()) notify_listeners();
}

}  // namespace castmesh::detail
