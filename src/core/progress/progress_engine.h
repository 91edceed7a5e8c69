// ProgressEngine: the one owner of data-plane progress in a process (a
// proc). Every thread that moves collective, point-to-point or RDMA bytes
// outside the transport's I/O thread belongs to it, and every wait for such
// bytes goes through it:
//
// - waiting callers: RequestState::wait hands the wait to wait(), which lets
//   the caller move bytes itself through the registered WaitSources (the
//   shared-memory rings, the watched sockets) under one wait policy
//   (wait_policy.h: spin, yielding when the core is contended, then sleep
//   on the source's wake-up words), and sleeps on the request otherwise;
// - one progress thread ("castmesh-progress"): runs the registered
//   BackgroundSources (what no waiter reads: unexpected messages, queued
//   sends of progress contexts) and sleeps on all their wake-up words at once;
// - a small pool of workers ("castmesh-work"): blocking jobs (a non-blocking
//   collective, a large RDMA copy) run there; Strands keep one
//   communicator's jobs in order. Threads are reused and bounded by the
//   settings (progress_max_workers); none is made per operation and none is
//   detached;
// - service threads of data paths that block in their own way (the NIC's
//   completion poller, the device watchdog), started through
//   start_service(), named and owned here like the others.
//
// docs/architecture.md "Progress" draws who does what. Thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "castmesh/communicator.h"
#include "castmesh/detail/mutex.h"
#include "core/scheduler/futex.h"

namespace castmesh::detail {
class RequestState;
class WaitDeadline;
}  // namespace castmesh::detail

namespace castmesh::progress {

// A place where a waiting caller can move bytes itself. Implemented by the
// data paths (link/shm_ring_waits.cc, collectives/socket_wait.cc) and
// registered once with add_wait_source(). A wait calls begin_wait() on the
// calling thread, then look()/spin/sleep, then end_wait() on the same
// thread; the source keeps what it needs between them per thread.
class WaitSource {
 public:
  // What one look did: `handled` something, or found the source `busy`
  // (another thread of this process holds part of it).
  struct Look {
    bool handled = false;
    bool busy = false;
  };
  virtual ~WaitSource() = default;
  // Starts a wait of this thread; false when the source has nothing to look
  // at (or this thread is already inside one of its waits). `local_peers`:
  // procs of this host the wait looks at (the oversubscription test).
  virtual bool begin_wait(size_t& local_peers) = 0;
  // How long to spin on it before sleeping (zero: sleep at once).
  virtual absl::Duration spin_budget(bool oversubscribed) = 0;
  // The wait goes on past its first look (spinning, if the budget allows,
  // then sleeping) / its spin ended (`ended_wait`: the request completed).
  virtual void start_spin() {}
  virtual void end_spin(bool ended_wait) { (void)ended_wait; }
  // One look; never blocks.
  virtual Look look() = 0;
  // Sleeps on the source's own wake-up words and the request until the
  // request is done or `deadline`, looking at the source when woken. False
  // when it cannot on this system (the engine then sleeps on the request).
  virtual bool sleep(detail::RequestState& request, absl::Time deadline) = 0;
  // Ends the wait begun by begin_wait().
  virtual void end_wait() = 0;
};

// Work the progress thread does for a data path when no caller waits.
class BackgroundSource {
 public:
  virtual ~BackgroundSource() = default;
  // One round; true when it did something (the thread goes round again).
  virtual bool run_once() = 0;
  // Before the thread sleeps: appends the words whose change wakes it (at
  // most what `items` can still take), lowers `nap` to the longest sleep it
  // allows, and returns true when it already has work (no sleep). Undone by
  // disarm() after the sleep.
  virtual bool arm(std::vector<detail::FutexWaitItem>& items, absl::Duration& nap) = 0;
  virtual void disarm() = 0;
};

// A job for the workers. `cancel` runs instead of `run` when the job is
// dropped before it starts (its strand is cancelled); may be empty.
struct Job {
  std::function<void()> run;
  std::function<void(const absl::Status&)> cancel;
};

// Jobs that run one at a time, in the order posted, on the engine's workers
// (one communicator's non-blocking operations). Thread-safe.
class Strand : public std::enable_shared_from_this<Strand> {
 public:
  explicit Strand(std::string name) : name_(std::move(name)) {}
  // Queues `job` after the ones posted before. Any thread.
  void post(Job job);
  // Drops the jobs that have not started (their `cancel` runs with `why` on
  // this thread). True when a job was running or queued. Any thread.
  bool cancel_pending(const absl::Status& why);
  const std::string& name() const { return name_; }

 private:
  void run_queued();

  const std::string name_;
  detail::Mutex mu_;
  std::deque<Job> queued_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
};

// Counters for tests and benchmarks.
struct ProgressStats {
  int workers = 0;            // worker threads made so far (they are reused)
  int services = 0;           // service threads (start_service)
  uint64_t jobs_run = 0;      // jobs the workers ran
  uint64_t jobs_cancelled = 0;
  uint64_t background_rounds = 0;  // rounds of the progress thread that did something
  uint64_t background_sleeps = 0;
};

class ProgressEngine {
 public:
  // This process's engine (made on first use, never destroyed: its threads
  // may run during exit).
  static ProgressEngine& instance();

  // Registers a source; `rank`: lower ranks are tried first. Sources are
  // never removed (they outlive every wait). Any thread.
  void add_wait_source(WaitSource* source, int rank);
  void add_background_source(BackgroundSource* source);
  // Wakes the progress thread (new work for a BackgroundSource). Any thread.
  void wake_background();

  // Waits for `request`, moving bytes through the wait sources meanwhile.
  // kDeadlineExceeded after `timeout`. The caller's thread.
  absl::StatusOr<MessageStatus> wait(detail::RequestState& request, absl::Duration timeout);
  // One look at every source (RequestState::test). The caller's thread.
  void look(detail::RequestState& request);

  // Starts the long-lived thread `name` running `loop` (a data path's own
  // poller; at most one per data path). Any thread.
  void start_service(const std::string& name, std::function<void()> loop);

  // Runs `job` on a worker (a new one only when none is idle and fewer than
  // the limit exist; beyond it the job queues). Any thread.
  void submit(Job job);

  ProgressStats stats();

 private:
  ProgressEngine();
  void worker_loop();
  void background_loop();
  // Sleeps on the request's own word until done or `until`.
  static bool sleep_on_request(detail::RequestState& request, absl::Time until);

  detail::Mutex mu_;
  std::vector<std::pair<int, WaitSource*>> wait_sources_ ABSL_GUARDED_BY(mu_);
  // Read without the lock by waiters: replaced (never changed) under mu_.
  // Every list made is kept in wait_lists_ (a waiter may still read an old
  // one; a handful of sources per process, registered once each).
  std::atomic<const std::vector<WaitSource*>*> wait_list_{nullptr};
  std::vector<std::unique_ptr<const std::vector<WaitSource*>>> wait_lists_ ABSL_GUARDED_BY(mu_);
  std::vector<BackgroundSource*> background_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);  // never joined: the engine is never destroyed
  bool background_started_ ABSL_GUARDED_BY(mu_) = false;
  int services_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint32_t> background_bell_{0};

  detail::Mutex jobs_mu_;
  detail::CondVar jobs_cv_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(jobs_mu_);
  int idle_workers_ ABSL_GUARDED_BY(jobs_mu_) = 0;
  int workers_ ABSL_GUARDED_BY(jobs_mu_) = 0;
  bool warned_full_ ABSL_GUARDED_BY(jobs_mu_) = false;

  std::atomic<uint64_t> jobs_run_{0}, background_rounds_{0}, background_sleeps_{0};
};

}  // namespace castmesh::progress
