#include "core/link/transfers.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"

namespace castmesh::link {

Transfers& Transfers::instance() {
  static auto* transfers = new Transfers;
  return *transfers;
}

uint64_t Transfers::next_id() {
  detail::MutexLock lock(mu_);
  return next_id_++;
}

void Transfers::start(const std::shared_ptr<Transfer>& transfer, absl::Duration timeout) {
  {
    detail::MutexLock lock(mu_);
    live_[transfer->id] = transfer;
  }
  std::weak_ptr<Transfer> weak = transfer;
  transfer->timer = timers_.add(timeout, absl::ZeroDuration(), [this, weak, timeout] {
    if (std::shared_ptr<Transfer> t = weak.lock()) {
      finish(t, absl::DeadlineExceededError(absl::StrCat("RDMA ", t->release ? "release" : t->write ? "write" : "read",
                                                         " of ", t->length, " bytes with proc ", t->remote.owner,
                                                         " did not finish within ", absl::FormatDuration(timeout))));
    }
  });
}

std::shared_ptr<Transfer> Transfers::find(uint64_t id) {
  detail::MutexLock lock(mu_);
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : it->second;
}

void Transfers::finish(const std::shared_ptr<Transfer>& transfer, absl::StatusOr<RdmaResult> result) {
  std::function<void(bool)> cleanup;
  {
    detail::MutexLock lock(transfer->mu);
    if (transfer->finished) return;
    transfer->finished = true;
    cleanup = std::move(transfer->cleanup);
  }
  {
    detail::MutexLock lock(mu_);
    live_.erase(transfer->id);
  }
  if (transfer->timer != 0) timers_.cancel(transfer->timer);
  if (cleanup) cleanup(result.ok());
  // Only the one finisher gets here: `done` is no longer shared.
  std::function<void(absl::StatusOr<RdmaResult>)> done = std::move(transfer->done);
  if (done) done(std::move(result));
}

void Transfers::deliver(const std::shared_ptr<Transfer>& transfer, uint64_t offset, const char* body, size_t size) {
  bool complete = false;
  bool outside = false;
  {
    detail::MutexLock lock(transfer->mu);
    if (transfer->finished) return;  // failed or timed out: not one more byte
    if (offset < transfer->offset || size > transfer->length - transfer->moved ||
        offset - transfer->offset > transfer->length - size) {
      outside = true;
    } else {
      if (size > 0) std::memcpy(transfer->bytes + (offset - transfer->offset), body, size);
      transfer->moved += size;
      complete = transfer->moved == transfer->length;
    }
  }
  if (outside) {
    finish(transfer, absl::InternalError(absl::StrCat("proc ", transfer->remote.owner, " sent ", size, " bytes at ", offset,
                                                      ", outside the read of [", transfer->offset, ", ",
                                                      transfer->offset + transfer->length, ")")));
  } else if (complete) {
    finish(transfer, RdmaResult{transfer->length, transfer->transport});
  }
}

bool Transfers::copy_if_live(const std::shared_ptr<Transfer>& transfer, const std::function<absl::Status()>& copy,
                             absl::Status* copied) {
  detail::MutexLock lock(transfer->mu);
  if (transfer->finished) return false;
  *copied = copy();
  return true;
}

void start_next(const std::shared_ptr<Transfer>& transfer) {
  if (transfer->routes.empty()) {
    return Transfers::instance().finish(
        transfer, absl::FailedPreconditionError(absl::StrCat("proc ", transfer->remote.owner,
                                                             " offers no transport this proc has for its RDMA buffer")));
  }
  transfer->routes.pop_front()->start(transfer);
}

void Transfers::owner_lost(const ProcId& owner, const absl::Status& why) {
  std::vector<std::shared_ptr<Transfer>> lost;
  {
    detail::MutexLock lock(mu_);
    for (const auto& [id, transfer] : live_) {
      if (transfer->remote.owner == owner) lost.push_back(transfer);
    }
  }
  for (const auto& transfer : lost) {
    finish(transfer, absl::UnavailableError(absl::StrCat("RDMA buffer owner proc ", owner,
                                                         " was lost: ", why.message())));
  }
}

}  // namespace castmesh::link
