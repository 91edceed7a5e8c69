// TimerQueue: one thread and a min-heap of deadlines for send_after and
// periodic sends. The thread starts on the first timer and sleeps on a
// condition variable until the earliest deadline (no polling). Actions run
// on the timer thread and must be quick (they send a message).
// Thread-safety: every method may be called from any thread.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/time/time.h>

#include <cstdint>
#include <functional>
#include <queue>
#include <thread>
#include <vector>

#include "castmesh/detail/mutex.h"

namespace castmesh::detail {

class TimerQueue {
 public:
  TimerQueue() = default;
  ~TimerQueue();  // stop()
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `fire` after `delay`, then every `period` if period > 0. Returns
  // the timer id (never 0), or 0 after stop().
  uint64_t add(absl::Duration delay, absl::Duration period, std::function<void()> fire);
  // True if the timer was still pending.
  bool cancel(uint64_t id);
  // Drops every timer and joins the thread. Idempotent.
  void stop();

 private:
  struct Entry {
    absl::Time when;
    uint64_t id;
    bool operator>(const Entry& o) const { return when > o.when || (when == o.when && id > o.id); }
  };
  struct Timer {
    absl::Duration period;
    std::shared_ptr<std::function<void()>> fire;
  };
  void run();

  detail::Mutex mu_;
  detail::CondVar cv_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Timer> timers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace castmesh::detail
