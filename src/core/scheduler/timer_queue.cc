#include "core/scheduler/timer_queue.h"

#include <absl/time/clock.h>

#include <memory>

#include "castmesh/detail/mutex.h"

namespace castmesh::detail {

TimerQueue::~TimerQueue() { stop(); }

uint64_t TimerQueue::add(absl::Duration delay, absl::Duration period, std::function<void()> fire) {
  detail::MutexLock lock(mu_);
  if (stopped_) return 0;
  const uint64_t id = next_id_++;
  timers_.emplace(id, Timer{period, std::make_shared<std::function<void()>>(std::move(fire))});
  heap_.push(Entry{absl::Now() + delay, id});
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  // The thread sleeps until the earliest deadline: only a new earliest one
  // needs to wake it (a wake-up per add costs a context switch per request
  // on a busy 2-core machine).
  if (heap_.top().id == id) cv_.notify_one();
  return id;
}

bool TimerQueue::cancel(uint64_t id) {
  detail::MutexLock lock(mu_);
  return timers_.erase(id) > 0;  // its heap entry is skipped when it comes up
}

void TimerQueue::stop() {
  std::thread t;
  {
    detail::MutexLock lock(mu_);
    stopped_ = true;
    timers_.clear();
    heap_ = {};
    t = std::move(thread_);
  }
  cv_.notify_all();
  if (t.joinable()) t.join();
}

void TimerQueue::run() {
  detail::MutexLock lock(mu_);
  while (!stopped_) {
    if (heap_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const Entry top = heap_.top();
    const absl::Time now = absl::Now();
    if (top.when > now) {
      cv_.wait_for(lock, top.when - now);
      continue;
    }
    heap_.pop();
    auto it = timers_.find(top.id);
    if (it == timers_.end()) continue;  // cancelled
    auto fire = it->second.fire;
    if (it->second.period > absl::ZeroDuration()) {
      heap_.push(Entry{top.when + it->second.period, top.id});
    } else {
      timers_.erase(it);
    }
    lock.unlock();
    (*fire)();
    lock.lock();
  }
}

}  // namespace castmesh::detail
