#include "core/actor/text.h"

#include <climits>

#include "castmesh/detail/future_state.h"
#include "core/actor/runtime_core.h"
#include "core/log/log.h"
#include "core/scheduler/futex.h"

namespace castmesh::detail {

absl::Status type_mismatch(std::string_view got, std::string_view expected) {
  return absl::InvalidArgumentError(
      str_cat("reply type mismatch: the handler answers ", got, ", the request expects ", expected));
}

void FutureStateBase::drop_promise() {
  // Once claimed (answered), the promise count no longer matters: it only
  // detects the last promise dropped without an answer. claimed_ never
  // goes back to false, so skipping the decrement is safe and saves an
  // atomic read-modify-write per request.
  if (claimed_.load(std::memory_order_acquire)) {
    unref();
    return;
  }
  if (promises_.fetch_sub(1, std::memory_order_acq_rel) == 1 && !claimed_.load(std::memory_order_acquire)) {
    fail(absl::AbortedError("request dropped without a reply (every copy of its reply port was destroyed)"));
  }
  unref();
}

void FutureStateBase::publish() {
  const uintptr_t cb = callback_.exchange(1, std::memory_order_acq_rel);
  if (cb > 1) {
    // Installing a callback consumed the one Future, so nobody waits: no
    // store-load fence and waiter check on this (the ask/reply) path.
    ready_.store(1, std::memory_order_release);
    reinterpret_cast<FutureCallback*>(cb)->on_future_ready(this);
    return;
  }
  ready_.store(1, std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_seq_cst) > 0) futex_wake(&ready_, INT_MAX);
}

bool FutureStateBase::wait(absl::Time deadline) {
  if (is_ready()) return true;
  // A pooled worker about to block: other workers (or a helper, when none is
  // left) run what it queued and the actors its answer may depend on.
  Scheduler::BlockingScope blocking;
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  bool ready = true;
  while (ready_.load(std::memory_order_seq_cst) == 0) {
    if (!futex_wait(&ready_, 0, deadline) && ready_.load(std::memory_order_seq_cst) == 0) {
      ready = false;
      break;
    }
  }
  waiters_.fetch_sub(1, std::memory_order_seq_cst);
  if (ready) (void)ready_.load(std::memory_order_acquire);
  return ready;
}

void FutureStateBase::set_callback(FutureCallback* cb) {
  uintptr_t expected = 0;
  if (callback_.compare_exchange_strong(expected, reinterpret_cast<uintptr_t>(cb), std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
    return;
  }
  cb->on_future_ready(this);  // already ready
}

void FutureStateBase::cancel() {
  cancelled_.store(true, std::memory_order_release);
  fail(absl::CancelledError("request cancelled"));
}

PortAddress FutureStateBase::port_address() {
  RuntimeCore* rt = RuntimeCore::current();
  if (rt == nullptr) {
    CASTMESH_LOG_ERROR("OncePort::address(): no runtime on this thread to register the reply port with");
    return {};
  }
  if (!registered_.exchange(true, std::memory_order_acq_rel)) {
    port_id_.store(rt->register_reply(this, ProcId{}), std::memory_order_release);
  }
  uint64_t id;
  while ((id = port_id_.load(std::memory_order_acquire)) == 0) cpu_relax();
  return PortAddress{rt->reply_owner(), id};
}

}  // namespace castmesh::detail
