#include "core/progress/request_state.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"
#include "core/progress/progress_engine.h"
#include "core/scheduler/futex.h"

namespace castmesh::detail {

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
  return progress::ProgressEngine::instance().wait(*this, timeout);
}

std::optional<absl::StatusOr<MessageStatus>> RequestState::test() {
  if (!done()) progress::ProgressEngine::instance().look(*this);
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
