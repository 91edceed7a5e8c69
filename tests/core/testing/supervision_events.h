// Collects the supervision events that reach a controller's root (set as
// LocalAllocatorOptions::on_supervision_event or a root failure handler),
// for tests that wait for one child's failure. Thread-safe: the handler
// runs on the runtime's threads, the waits on the test's.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "castmesh/supervision.h"

namespace castmesh::testing {

struct SupervisionEvents {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<SupervisionEvent> events;

  // A handler that records each event; the object must outlive its use.
  std::function<void(const SupervisionEvent&)> handler() {
    return [this](const SupervisionEvent& e) {
      std::lock_guard lock(mu);
      events.push_back(e);
      cv.notify_all();
    };
  }
  // The latest event about `child`, waiting up to `timeout` for one.
  std::optional<SupervisionEvent> wait_for_child(const Address& child,
                                                 std::chrono::seconds timeout = std::chrono::seconds(10)) {
    std::unique_lock lock(mu);
    std::optional<SupervisionEvent> found;
    cv.wait_for(lock, timeout, [&] {
      for (const auto& e : events) {
        if (e.child == child) found = e;
      }
      return found.has_value();
    });
    return found;
  }
};

}  // namespace castmesh::testing
