// ObserverRegistry: callbacks that services add and remove by id, told of
// one kind of event (a lost peer, a failure a peer reported). The one
// registry type of the proc layer: ProcHost keeps one for lost peers,
// RemoteSupervision one for reported failures.
//
// Threading: thread-safe. notify() copies the callbacks under the lock and
// calls them without it, so an observer may add or remove observers (its
// removal then takes effect from the next event).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "castmesh/detail/mutex.h"

namespace castmesh::proc {

template <typename... Args>
class ObserverRegistry {
 public:
  using Observer = std::function<void(const Args&...)>;

  // Adds `observer`; the id (never 0) removes it.
  uint64_t add(Observer observer) {
    detail::MutexLock lock(mu_);
    const uint64_t id = next_id_++;
    observers_.emplace(id, std::move(observer));
    return id;
  }
  // Removes an observer; unknown ids are ignored.
  void remove(uint64_t id) {
    detail::MutexLock lock(mu_);
    observers_.erase(id);
  }
  // Calls every observer with `args`, on the calling thread.
  void notify(const Args&... args) const {
    std::vector<Observer> observers;
    {
      detail::MutexLock lock(mu_);
      observers.reserve(observers_.size());
      for (const auto& [id, observer] : observers_) observers.push_back(observer);
    }
    for (const Observer& observer : observers) observer(args...);
  }

 private:
  mutable detail::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Observer> observers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace castmesh::proc
