#include "core/scheduler/scheduler.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <utility>

#include "core/log/log.h"
#include "core/scheduler/futex.h"

namespace castmesh::detail {

namespace {
constexpr int kMaxNextStreak = 16;   // next-slot picks before the local queue gets a turn
constexpr int kGlobalCheckEvery = 61;
constexpr int kSpinRounds = 32;      // short spin before parking (about 1-3 us)
constexpr int kPausesPerRound = 16;
constexpr size_t kMaxHelpers = 256;    // helper threads alive per scheduler (BlockingScope)
}  // namespace

void SchedQueue::push(Schedulable* s) {
  s->sched_next_ = nullptr;
  if (tail) {
    tail->sched_next_ = s;
  } else {
    head = s;
  }
  tail = s;
  ++size;
}

Schedulable* SchedQueue::pop() {
  Schedulable* s = head;
  if (!s) return nullptr;
  head = s->sched_next_;
  if (!head) tail = nullptr;
  s->sched_next_ = nullptr;
  --size;
  return s;
}

namespace {
// The lock of a worker's queue: a std::mutex that spins a little before it
// sleeps. The owner and a thief hold it for a few instructions, and glibc's
// std::mutex otherwise sleeps in the kernel as soon as they meet (thousands
// of futex sleeps per fork-join run). absl::Mutex spins too, but its
// uncontended path cost 8-15% on ping-pong, N:1 and spawn here.
class ABSL_LOCKABLE QueueMutex {
 public:
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    for (int i = 0; i < 64; ++i) {
      if (mu_.try_lock()) return;
      cpu_relax();
    }
    mu_.lock();
  }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

// Holds a QueueMutex for its scope.
class ABSL_SCOPED_LOCKABLE QueueLock {
 public:
  explicit QueueLock(QueueMutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_.lock(); }
  ~QueueLock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  QueueLock(const QueueLock&) = delete;
  QueueLock& operator=(const QueueLock&) = delete;

 private:
  QueueMutex& mu_;
};
}  // namespace

struct Scheduler::Worker {
  Scheduler* owner = nullptr;
  size_t index = 0;
  std::thread thread;
  Schedulable* next = nullptr;  // owner thread only
  int next_streak = 0;
  uint64_t tick = 0;
  uint32_t rng = 0;
  bool searching = false;
  QueueMutex mu;
  SchedQueue queue ABSL_GUARDED_BY(mu);
  std::atomic<size_t> queue_size{0};
  std::atomic<uint32_t> wake_token{0};
  std::atomic<bool> finished{false};  // helpers: the thread has left run_helper
};

namespace {
// initial-exec: read on every schedule(); a plain %fs-relative load instead
// of __tls_get_addr in this shared library (one pointer of static TLS).
__attribute__((tls_model("initial-exec"))) thread_local Scheduler::Worker* tl_worker = nullptr;
}

Scheduler::Scheduler(int workers, int batch, std::function<void()> on_thread_start)
    : batch_(std::max(1, batch)), on_thread_start_(std::move(on_thread_start)) {
  const int n = std::max(1, workers);
  workers_.reserve(n);
  for (int i = 0; i < n; ++i) {
    auto w = std::make_unique<Worker>();
    w->owner = this;
    w->index = static_cast<size_t>(i);
    w->rng = 0x9e3779b9u * static_cast<uint32_t>(i + 1);
    workers_.push_back(std::move(w));
  }
  for (auto& w : workers_) {
    Worker* raw = w.get();
    raw->thread = std::thread([this, raw] { run(raw); });
  }
}

Scheduler::~Scheduler() { stop(); }

bool Scheduler::on_worker_thread() const { return tl_worker != nullptr && tl_worker->owner == this; }

void Scheduler::schedule(Schedulable* s) {
  Worker* w = tl_worker;
  if (w != nullptr && w->owner == this) {
    if (w->next == nullptr) {
      // Runs right after the current turn on this thread; no wake-up needed.
      w->next = s;
      return;
    }
    Schedulable* prev = w->next;
    w->next = s;
    push_local(w, prev);
  } else {
    push_global(s);
  }
  notify_one();
}

void Scheduler::before_blocking() {
  Worker* w = tl_worker;
  if (w == nullptr || w->owner != this) return;
  bool moved = false;
  if (w->next) {
    push_global(std::exchange(w->next, nullptr));
    moved = true;
  }
  SchedQueue local;
  {
    QueueLock lock(w->mu);
    std::swap(local, w->queue);
    w->queue_size.store(0, std::memory_order_relaxed);
  }
  while (Schedulable* s = local.pop()) {
    push_global(s);
    moved = true;
  }
  if (moved) notify_one();
}

void Scheduler::before_blocking_on_this_thread() {
  if (Worker* w = tl_worker) w->owner->before_blocking();
}

namespace {
// What promised that the calling thread never blocks (NonBlockingSection), or nullptr.
thread_local const char* tl_non_blocking = nullptr;
std::atomic<bool> g_reported_blocking_in_non_blocking{false};
}  // namespace

Scheduler::NonBlockingSection::NonBlockingSection(const char* who) : previous_(std::exchange(tl_non_blocking, who)) {}
Scheduler::NonBlockingSection::~NonBlockingSection() { tl_non_blocking = previous_; }

Scheduler::BlockingScope::BlockingScope() {
  if (tl_non_blocking != nullptr && !g_reported_blocking_in_non_blocking.exchange(true, std::memory_order_relaxed)) {
    CASTMESH_LOG_ERROR("{} waits for something (Future::get, a collective) on a thread it promised not to block; "
                       "this wait may never end: drop kShortHandlers from its class",
                       tl_non_blocking);
  }
  if (Worker* w = tl_worker) {
    scheduler_ = w->owner;
    scheduler_->enter_blocking();
  }
}

Scheduler::BlockingScope::~BlockingScope() {
  if (scheduler_ != nullptr) scheduler_->leave_blocking();
}

void Scheduler::enter_blocking() {
  before_blocking();
  const int blocked = blocked_.fetch_add(1, std::memory_order_acq_rel) + 1;
  const int threads = static_cast<int>(workers_.size()) + helpers_alive_.load(std::memory_order_acquire);
  if (blocked < threads || done_.load(std::memory_order_acquire)) return;
  // Every thread that could run actors waits: one more runs them meanwhile
  // (bounded, in case a program blocks without end).
  MutexLock lock(helpers_mu_);
  // Reap helpers that have left (their threads end right after).
  for (auto it = helpers_.begin(); it != helpers_.end();) {
    if ((*it)->finished.load(std::memory_order_acquire)) {
      (*it)->thread.join();
      it = helpers_.erase(it);
    } else {
      ++it;
    }
  }
  if (helpers_.size() >= kMaxHelpers) return;
  auto helper = std::make_unique<Worker>();
  helper->owner = this;
  helper->index = workers_.size() + helpers_.size();
  helper->rng = 0x85ebca6bu * static_cast<uint32_t>(helper->index + 1);
  Worker* raw = helper.get();
  helpers_alive_.fetch_add(1, std::memory_order_acq_rel);
  helpers_started_.fetch_add(1, std::memory_order_relaxed);
  raw->thread = std::thread([this, raw] { run_helper(raw); });
  helpers_.push_back(std::move(helper));
}

void Scheduler::leave_blocking() { blocked_.fetch_sub(1, std::memory_order_acq_rel); }

void Scheduler::run_helper(Worker* w) {
  tl_worker = w;
  if (on_thread_start_) on_thread_start_();
  int idle_rounds = 0;
  while (!done_.load(std::memory_order_acquire)) {
    if (Schedulable* s = find_work(w)) {
      idle_rounds = 0;
      if (s->run_turn(batch_) == Schedulable::TurnResult::kMore) push_local(w, s);
      continue;
    }
    // Nothing runnable: leave once a worker is free to run what comes next.
    const int threads = static_cast<int>(workers_.size()) + helpers_alive_.load(std::memory_order_acquire);
    if (blocked_.load(std::memory_order_acquire) < threads - 1) break;
    // Helpers poll (they are rare and short-lived): 50 us, backing off to 2 ms.
    std::this_thread::sleep_for(std::chrono::microseconds(std::min(2000, 50 << std::min(idle_rounds++, 6))));
  }
  // Hand back anything still queued here; nobody steals from a helper.
  bool moved = false;
  if (w->next) {
    push_global(std::exchange(w->next, nullptr));
    moved = true;
  }
  {
    QueueLock lock(w->mu);
    while (Schedulable* s = w->queue.pop()) {
      push_global(s);
      moved = true;
    }
    w->queue_size.store(0, std::memory_order_relaxed);
  }
  helpers_alive_.fetch_sub(1, std::memory_order_acq_rel);
  if (moved) notify_one();
  tl_worker = nullptr;
  w->finished.store(true, std::memory_order_release);
}

void Scheduler::push_global(Schedulable* s) {
  MutexLock lock(global_mu_);
  global_.push(s);
  global_size_.store(global_.size, std::memory_order_relaxed);
}

Schedulable* Scheduler::pop_global() {
  if (global_size_.load(std::memory_order_relaxed) == 0) return nullptr;
  MutexLock lock(global_mu_);
  Schedulable* s = global_.pop();
  global_size_.store(global_.size, std::memory_order_relaxed);
  return s;
}

void Scheduler::push_local(Worker* w, Schedulable* s) {
  QueueLock lock(w->mu);
  w->queue.push(s);
  w->queue_size.store(w->queue.size, std::memory_order_relaxed);
}

Schedulable* Scheduler::find_work(Worker* w) {
  ++w->tick;
  if (w->tick % kGlobalCheckEvery == 0) {
    if (Schedulable* s = pop_global()) return s;
  }
  if (w->next) {
    if (w->next_streak < kMaxNextStreak) {
      ++w->next_streak;
      return std::exchange(w->next, nullptr);
    }
    // Let the local queue run before the next slot again (fairness).
    push_local(w, std::exchange(w->next, nullptr));
  }
  w->next_streak = 0;
  if (w->queue_size.load(std::memory_order_relaxed) > 0) {
    QueueLock lock(w->mu);
    Schedulable* s = w->queue.pop();
    w->queue_size.store(w->queue.size, std::memory_order_relaxed);
    if (s) return s;
  }
  if (Schedulable* s = pop_global()) return s;
  return steal(w);
}

Schedulable* Scheduler::steal(Worker* w) {
  const size_t n = workers_.size();
  if (n < 2) return nullptr;
  w->rng = w->rng * 1664525u + 1013904223u;
  const size_t start = w->rng % n;
  for (size_t i = 0; i < n; ++i) {
    Worker* victim = workers_[(start + i) % n].get();
    if (victim == w || victim->queue_size.load(std::memory_order_relaxed) == 0) continue;
    SchedQueue taken;
    {
      QueueLock lock(victim->mu);
      const size_t take = (victim->queue.size + 1) / 2;
      for (size_t k = 0; k < take; ++k) taken.push(victim->queue.pop());
      victim->queue_size.store(victim->queue.size, std::memory_order_relaxed);
    }
    Schedulable* first = taken.pop();
    if (!first) continue;
    if (taken.size > 0) {
      QueueLock lock(w->mu);
      while (Schedulable* s = taken.pop()) w->queue.push(s);
      w->queue_size.store(w->queue.size, std::memory_order_relaxed);
    }
    return first;
  }
  return nullptr;
}

void Scheduler::notify_one() {
  store_load_barrier();
  if (num_sleepers_.load(std::memory_order_relaxed) == 0) return;
  if (num_searching_.load(std::memory_order_relaxed) > 0) return;
  Worker* target = nullptr;
  {
    MutexLock lock(sleep_mu_);
    if (sleepers_.empty()) return;
    target = sleepers_.back();
    sleepers_.pop_back();
    num_sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    num_searching_.fetch_add(1, std::memory_order_seq_cst);
    target->wake_token.store(1, std::memory_order_release);
  }
  futex_wake(&target->wake_token, 1);
}

void Scheduler::leave_searching(Worker* w) {
  if (!w->searching) return;
  w->searching = false;
  // The last searcher to find work wakes another if more work is waiting.
  if (num_searching_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
      global_size_.load(std::memory_order_relaxed) > 0) {
    notify_one();
  }
}

bool Scheduler::cancel_sleep(Worker* w) {
  MutexLock lock(sleep_mu_);
  auto it = std::find(sleepers_.begin(), sleepers_.end(), w);
  if (it != sleepers_.end()) {
    sleepers_.erase(it);
    num_sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    return false;
  }
  // A notifier took us off the list (and counted us as searching).
  w->wake_token.store(0, std::memory_order_relaxed);
  w->searching = true;
  return true;
}

void Scheduler::resume_searching(Worker* w) {
  if (cancel_sleep(w)) return;  // a notifier took us: counted as searching already
  // Until this worker's decrement in park(), a pusher may have seen it
  // searching and woken nobody, leaving the rest of what it pushed (a
  // BlockingScope hands on its whole queue) to this worker's leave_searching().
  w->searching = true;
  num_searching_.fetch_add(1, std::memory_order_seq_cst);
}

bool Scheduler::park(Worker* w) {
  {
    MutexLock lock(sleep_mu_);
    w->wake_token.store(0, std::memory_order_relaxed);
    sleepers_.push_back(w);
    num_sleepers_.fetch_add(1, std::memory_order_seq_cst);
  }
  if (w->searching) {
    w->searching = false;
    num_searching_.fetch_sub(1, std::memory_order_seq_cst);
  }
  store_load_barrier();
  for (;;) {
    // Re-check after announcing: a push that missed our registration is
    // visible here (both sides fence).
    if (done_.load(std::memory_order_acquire)) {
      cancel_sleep(w);
      return false;
    }
    if (global_size_.load(std::memory_order_relaxed) > 0 || w->queue_size.load(std::memory_order_relaxed) > 0) {
      resume_searching(w);
      return true;
    }
    bool others_have_work = false;
    for (auto& other : workers_) {
      if (other->queue_size.load(std::memory_order_relaxed) > 0) others_have_work = true;
    }
    if (others_have_work) {
      resume_searching(w);
      return true;
    }
    futex_wait(&w->wake_token, 0, absl::InfiniteFuture());
    if (w->wake_token.load(std::memory_order_acquire) == 1) {
      MutexLock lock(sleep_mu_);
      w->wake_token.store(0, std::memory_order_relaxed);
      w->searching = true;
      return !done_.load(std::memory_order_acquire);
    }
  }
}

void Scheduler::run(Worker* w) {
  tl_worker = w;
  if (on_thread_start_) on_thread_start_();
  while (!done_.load(std::memory_order_acquire)) {
    Schedulable* s = find_work(w);
    for (int round = 0; s == nullptr && round < kSpinRounds; ++round) {
      for (int k = 0; k < kPausesPerRound; ++k) cpu_relax();
      s = find_work(w);
    }
    if (s == nullptr) {
      if (!park(w)) break;
      continue;
    }
    leave_searching(w);
    if (s->run_turn(batch_) == Schedulable::TurnResult::kMore) {
      push_local(w, s);
      // More than one runnable actor here: let a parked worker help.
      if (w->queue_size.load(std::memory_order_relaxed) > 1 || w->next != nullptr) notify_one();
    }
  }
  tl_worker = nullptr;
}

void Scheduler::stop() {
  auto join_helpers = [this] {
    std::vector<std::unique_ptr<Worker>> helpers;
    {
      MutexLock lock(helpers_mu_);
      helpers.swap(helpers_);
    }
    for (auto& h : helpers) {
      if (h->thread.joinable() && h->thread.get_id() != std::this_thread::get_id()) h->thread.join();
    }
  };
  if (done_.exchange(true)) {
    join_helpers();
    for (auto& w : workers_) {
      if (w->thread.joinable() && w->thread.get_id() != std::this_thread::get_id()) w->thread.join();
    }
    return;
  }
  std::vector<Worker*> sleeping;
  {
    MutexLock lock(sleep_mu_);
    sleeping.swap(sleepers_);
    num_sleepers_.store(0);
    for (Worker* w : sleeping) w->wake_token.store(1, std::memory_order_release);
  }
  for (Worker* w : sleeping) futex_wake(&w->wake_token, 1);
  for (auto& w : workers_) {
    if (w->thread.joinable()) w->thread.join();
  }
  join_helpers();
}

DedicatedThread::DedicatedThread(Schedulable* s, int batch, std::function<void()> on_thread_start)
    : s_(s), batch_(std::max(1, batch)), on_thread_start_(std::move(on_thread_start)) {
  thread_ = std::thread([this] { run(); });
}

DedicatedThread::~DedicatedThread() { join(); }

void DedicatedThread::join() {
  if (thread_.joinable()) thread_.join();
}

void DedicatedThread::wake() {
  if (token_.exchange(1, std::memory_order_release) == 0) futex_wake(&token_, 1);
}

void DedicatedThread::run() {
  if (on_thread_start_) on_thread_start_();
  for (;;) {
    while (token_.exchange(0, std::memory_order_acquire) == 0) futex_wait(&token_, 0, absl::InfiniteFuture());
    Schedulable::TurnResult r;
    do {
      r = s_->run_turn(batch_);
    } while (r == Schedulable::TurnResult::kMore);
    if (r == Schedulable::TurnResult::kStopped) return;
  }
}

}  // namespace castmesh::detail
