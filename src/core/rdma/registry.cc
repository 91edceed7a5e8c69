#include "core/rdma/registry.h"
#include "core/progress/progress_engine.h"

#include <random>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"

namespace castmesh::rdma {

absl::Status check_operation(const std::string& what, size_t size, RdmaAccess access, bool write, uint64_t offset,
                             uint64_t length) {
  const auto needed = static_cast<uint32_t>(write ? RdmaAccess::kWrite : RdmaAccess::kRead);
  if ((static_cast<uint32_t>(access) & needed) == 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " was registered without ", write ? "write" : "read", " access"));
  }
  if (offset > size || length > size - offset) {
    return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", ", offset + length, ") are outside ", what,
                                              " of ", size, " bytes"));
  }
  return absl::OkStatus();
}

FreedCallbacks::~FreedCallbacks() {
  std::vector<std::function<void()>> callbacks;
  {
    detail::MutexLock lock(mu_);
    callbacks.swap(callbacks_);
  }
  for (auto& callback : callbacks) callback();
}

void FreedCallbacks::add(std::function<void()> callback) const {
  detail::MutexLock lock(mu_);
  callbacks_.push_back(std::move(callback));
}

void when_freed(std::shared_ptr<const Registration> registration, std::function<void()> done) {
  if (registration == nullptr) return done();
  // Released registrations are reachable only through shared_ptrs their
  // holders own, so a count of 1 cannot grow again.
  if (registration.use_count() == 1) {
    registration.reset();
    return done();
  }
  registration->freed.add(
      [done = std::move(done)] { progress::ProgressEngine::instance().submit(progress::Job{done, {}}); });
}

Registry& Registry::instance() {
  static auto* registry = new Registry;
  return *registry;
}

std::shared_ptr<const Registration> Registry::add(TensorView view, RdmaAccess access, ProcId owner,
                                                  std::shared_ptr<void> nic, uint32_t rkey) {
  auto made = std::make_shared<Registration>();
  made->base = static_cast<char*>(view.data());
  if (nic != nullptr) {
    made->nic = std::move(nic);
    made->nic_address = reinterpret_cast<uint64_t>(made->base);
    made->rkey = rkey;
  }
  made->size = view.nbytes();
  made->view = std::move(view);
  made->access = access;
  made->owner = std::move(owner);
  detail::MutexLock lock(mu_);
  if (next_id_ == 0) {
    // Ids start at a random point so a stale handle from an earlier process
    // with the same pid does not name a buffer of this one by accident.
    next_id_ = (std::random_device{}() | (uint64_t{std::random_device{}()} << 32)) & ((uint64_t{1} << 62) - 1);
    next_id_ += 1;
  }
  made->id = next_id_++;
  live_[made->id] = made;
  return made;
}

absl::StatusOr<std::shared_ptr<const Registration>> Registry::open(uint64_t id, bool write, uint64_t offset,
                                                                   uint64_t length) {
  std::shared_ptr<const Registration> found;
  {
    detail::MutexLock lock(mu_);
    auto it = live_.find(id);
    if (it != live_.end()) found = it->second;
  }
  if (found == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("RDMA buffer ", id, " was released (or never registered in this process)"));
  }
  absl::Status ok = check_operation(absl::StrCat("RDMA buffer ", id), found->size, found->access, write, offset, length);
  if (!ok.ok()) return ok;
  return found;
}

std::shared_ptr<const Registration> Registry::release(uint64_t id) {
  detail::MutexLock lock(mu_);
  auto it = live_.find(id);
  if (it == live_.end()) return nullptr;
  std::shared_ptr<const Registration> dropped = std::move(it->second);  // the caller drops it, outside the lock
  live_.erase(it);
  return dropped;
}

void Registry::pin(const ProcId& peer, uint64_t op, std::shared_ptr<const Registration> registration) {
  detail::MutexLock lock(mu_);
  pins_[std::make_pair(peer, op)] = std::move(registration);
}

void Registry::unpin(const ProcId& peer, uint64_t op) {
  std::shared_ptr<const Registration> dropped;
  detail::MutexLock lock(mu_);
  auto it = pins_.find(std::make_pair(peer, op));
  if (it == pins_.end()) return;
  dropped = std::move(it->second);
  pins_.erase(it);
}

void Registry::forget_peer(const ProcId& peer) {
  std::vector<std::shared_ptr<const Registration>> dropped;
  detail::MutexLock lock(mu_);
  for (auto it = pins_.begin(); it != pins_.end();) {
    if (it->first.first == peer) {
      dropped.push_back(std::move(it->second));
      pins_.erase(it++);
    } else {
      ++it;
    }
  }
}

}  // namespace castmesh::rdma
