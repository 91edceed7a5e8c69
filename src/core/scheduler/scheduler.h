// Scheduler: the worker pool that runs actors whose mailboxes are not empty.
//
// Each worker has a "next" slot (the actor its running actor just woke: runs
// right after the current turn, cache-hot, no wake-up of another thread), a
// local FIFO queue (others steal half of it when idle), and shares one
// global queue (work from non-worker threads; checked every 61 picks for
// fairness). A turn handles at most `batch` messages, then the actor goes to
// the back of the local queue, so a busy actor cannot starve others.
// Idle workers spin briefly, then park on a futex; pushing work wakes one
// parked worker only when no worker is already searching, so wake-ups cost
// one system call and an idle runtime uses no CPU.
// A handler that blocks (Future::get, a blocking collective) opens a
// BlockingScope: its queued work goes to the others, and while every worker
// is blocked, helper threads run the runnable actors (so actors that wait for
// each other, e.g. the members of a collective, cannot deadlock a pool with
// fewer workers than members). Helpers leave once a worker is free again.
// Thread-safety: schedule() from any thread; the rest is internal.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "castmesh/detail/mutex.h"

namespace castmesh::detail {

// Something the scheduler runs: an actor cell. A Schedulable is in at most
// one queue at a time (the mailbox's blocked/unblocked protocol ensures it).
class Schedulable {
 public:
  enum class TurnResult { kIdle, kMore, kStopped };
  // Runs up to `batch` messages. kIdle: nothing left, mailbox now blocked
  // (a later push reschedules); kMore: call again; kStopped: the actor is
  // gone (the object may already be destroyed).
  virtual TurnResult run_turn(int batch) = 0;

 protected:
  ~Schedulable() = default;

 private:
  friend class Scheduler;
  friend struct SchedQueue;
  Schedulable* sched_next_ = nullptr;
};

// Intrusive FIFO of Schedulables; not synchronized.
struct SchedQueue {
  Schedulable* head = nullptr;
  Schedulable* tail = nullptr;
  size_t size = 0;
  void push(Schedulable* s);
  Schedulable* pop();
};

class Scheduler {
 public:
  // `on_thread_start` runs first on every worker thread (sets thread-locals).
  Scheduler(int workers, int batch, std::function<void()> on_thread_start);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Makes `s` runnable. Any thread.
  void schedule(Schedulable* s);
  // The calling thread is about to block (e.g. Future::get inside a
  // handler): hand its pending work to others so nothing waits on it.
  void before_blocking();
  // before_blocking() on the scheduler of the calling worker thread, if any.
  static void before_blocking_on_this_thread();

  // Marks the calling thread, if it is a worker (or helper) of a scheduler,
  // as blocked from construction to destruction: before_blocking(), and a
  // helper thread starts when no worker is left to run actors. Use around
  // every wait a handler may make; on other threads it does nothing.
  class BlockingScope {
   public:
    BlockingScope();
    ~BlockingScope();
    BlockingScope(const BlockingScope&) = delete;
    BlockingScope& operator=(const BlockingScope&) = delete;

   private:
    Scheduler* scheduler_ = nullptr;
  };
  // Marks the calling thread, from construction to destruction, as running
  // code that promised never to block (a short-handler actor's turn on a
  // transport thread, whose waits nobody else could cover). A BlockingScope
  // opened inside logs an error naming `who` (once per process): the wait
  // may never end, since the thread it holds is the one that would end it.
  class NonBlockingSection {
   public:
    explicit NonBlockingSection(const char* who);
    ~NonBlockingSection();
    NonBlockingSection(const NonBlockingSection&) = delete;
    NonBlockingSection& operator=(const NonBlockingSection&) = delete;

   private:
    const char* previous_;
  };
  // Helper threads started so far (statistics and tests).
  int helpers_started() const { return helpers_started_.load(std::memory_order_relaxed); }
  // True when called on one of this scheduler's workers.
  bool on_worker_thread() const;
  // Stops and joins the workers (work still queued is not run). Idempotent.
  void stop();
  int worker_count() const { return static_cast<int>(workers_.size()); }

  struct Worker;  // defined in scheduler.cc

 private:
  void run(Worker* w);
  Schedulable* find_work(Worker* w);
  Schedulable* steal(Worker* w);
  Schedulable* pop_global();
  void push_global(Schedulable* s);
  void push_local(Worker* w, Schedulable* s);
  // Parks until notified (or stop); returns false on stop.
  bool park(Worker* w);
  bool cancel_sleep(Worker* w);
  // park() found work before sleeping: cancel_sleep(), and search again
  // (leave_searching() then wakes another worker if more work is waiting).
  void resume_searching(Worker* w);
  void notify_one();
  void leave_searching(Worker* w);
  // Blocking accounting (BlockingScope) and the helper threads it starts.
  void enter_blocking();
  void leave_blocking();
  void run_helper(Worker* w);

  const int batch_;
  std::function<void()> on_thread_start_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<bool> done_{false};

  Mutex global_mu_;
  SchedQueue global_ ABSL_GUARDED_BY(global_mu_);
  std::atomic<size_t> global_size_{0};

  Mutex sleep_mu_;
  std::vector<Worker*> sleepers_ ABSL_GUARDED_BY(sleep_mu_);
  std::atomic<int> num_sleepers_{0};
  std::atomic<int> num_searching_{0};

  // Threads (workers and helpers) inside a BlockingScope, and helpers alive.
  std::atomic<int> blocked_{0};
  std::atomic<int> helpers_alive_{0};
  std::atomic<int> helpers_started_{0};
  Mutex helpers_mu_;
  std::vector<std::unique_ptr<Worker>> helpers_ ABSL_GUARDED_BY(helpers_mu_);  // joined by stop()
};

// A thread that runs one actor (SpawnOptions::dedicated_thread).
class DedicatedThread {
 public:
  DedicatedThread(Schedulable* s, int batch, std::function<void()> on_thread_start);
  ~DedicatedThread();  // joins
  // Makes the actor runnable. Any thread.
  void wake();
  void join();

 private:
  void run();
  Schedulable* const s_;
  const int batch_;
  std::function<void()> on_thread_start_;
  std::atomic<uint32_t> token_{0};
  std::thread thread_;
};

}  // namespace castmesh::detail
