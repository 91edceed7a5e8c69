#include "core/progress/progress_engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "castmesh/config.h"
#include "core/log/log.h"
#include "core/platform/process.h"
#include "core/progress/request_state.h"
#include "core/progress/wait_policy.h"
#include "core/scheduler/scheduler.h"

namespace castmesh::progress {
namespace {

// Workers at most: jobs beyond them queue. A worker runs one blocking job
// (one communicator's non-blocking operation, one large RDMA copy) at a
// time, and such a job may wait for a peer whose progress needs another
// job of this process, so the limit is generous; the threads are made only
// when that many jobs run at once.
int max_workers() {
  static const int n = config::global().progress_max_workers;  // read once: docs/config.md
  return n;
}

std::atomic<uint64_t> g_jobs_cancelled{0};

// The progress thread's longest sleep when no source asks for less.
constexpr absl::Duration kBackgroundNap = absl::Milliseconds(50);

}  // namespace

// ---- Strand ----

void Strand::post(Job job) {
  {
    detail::MutexLock lock(mu_);
    queued_.push_back(std::move(job));
    if (running_) return;
    running_ = true;
  }
  ProgressEngine::instance().submit(Job{[self = shared_from_this()] { self->run_queued(); }, {}});
}

void Strand::run_queued() {
  while (true) {
    Job job;
    {
      detail::MutexLock lock(mu_);
      if (queued_.empty()) {
        running_ = false;
        return;
      }
      job = std::move(queued_.front());
      queued_.pop_front();
    }
    job.run();
  }
}

bool Strand::cancel_pending(const absl::Status& why) {
  std::deque<Job> dropped;
  bool running;
  {
    detail::MutexLock lock(mu_);
    dropped.swap(queued_);
    running = running_;
  }
  for (Job& job : dropped) {
    g_jobs_cancelled.fetch_add(1, std::memory_order_relaxed);
    if (job.cancel) job.cancel(why);
  }
  return running || !dropped.empty();
}

// ---- ProgressEngine ----

ProgressEngine& ProgressEngine::instance() {
  static auto* engine = new ProgressEngine;  // leaked: its threads may run during exit
  return *engine;
}

ProgressEngine::ProgressEngine() {
  detail::MutexLock lock(mu_);
  wait_lists_.push_back(std::make_unique<const std::vector<WaitSource*>>());
  wait_list_.store(wait_lists_.back().get(), std::memory_order_release);
}

void ProgressEngine::add_wait_source(WaitSource* source, int rank) {
  detail::MutexLock lock(mu_);
  wait_sources_.emplace_back(rank, source);
  std::stable_sort(wait_sources_.begin(), wait_sources_.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  auto list = std::make_unique<std::vector<WaitSource*>>();
  for (const auto& [rank_of, s] : wait_sources_) list->push_back(s);
  wait_list_.store(list.get(), std::memory_order_release);
  wait_lists_.push_back(std::move(list));  // the old ones stay: a waiter may still read one
}

void ProgressEngine::add_background_source(BackgroundSource* source) {
  detail::MutexLock lock(mu_);
  background_.push_back(source);
  if (!background_started_) {
    background_started_ = true;
    threads_.emplace_back([this] { background_loop(); });
  }
  wake_background();
}

void ProgressEngine::start_service(const std::string& name, std::function<void()> loop) {
  detail::MutexLock lock(mu_);
  ++services_;
  threads_.emplace_back([name, loop = std::move(loop)] {
    platform::set_current_thread_name(name.c_str());
    loop();
  });
}

void ProgressEngine::wake_background() {
  background_bell_.fetch_add(1, std::memory_order_release);
  detail::futex_wake(&background_bell_, 1);
}

bool ProgressEngine::sleep_on_request(detail::RequestState& request, absl::Time until) {
  // A pooled actor about to block hands its queued work to other workers,
  // or to a helper when none is left.
  detail::Scheduler::BlockingScope blocking;
  while (!request.done()) {
    request.add_sleeper();
    // futex_wait re-reads the word: a complete() that saw no sleeper stored
    // done_word() first, so the sleep does not start.
    const bool woken = detail::futex_wait(request.done_word(), 0, until);
    request.remove_sleeper();
    if (!woken && !request.done()) return false;
  }
  return true;
}

absl::StatusOr<MessageStatus> ProgressEngine::wait(detail::RequestState& request, absl::Duration timeout) {
  detail::WaitDeadline deadline(timeout);
  auto still_pending = [&] {
    return absl::DeadlineExceededError(absl::StrCat("operation still pending after ", absl::FormatDuration(timeout)));
  };
  bool slept = false;  // a source slept until done or the deadline
  const std::vector<WaitSource*>& sources = *wait_list_.load(std::memory_order_acquire);
  for (WaitSource* source : sources) {
    size_t local_peers = 0;
    if (!source->begin_wait(local_peers)) continue;
    // The awaited bytes are often there already: one look before the clock.
    (void)source->look();
    if (!request.done()) {
      const bool crowded = oversubscribed(local_peers);
      const absl::Time start = absl::Now();
      const absl::Time until = std::min(start + source->spin_budget(crowded), deadline.at(start));
      source->start_spin();
      // A zero budget (the source says spinning does not pay) means sleep at
      // once: no looks beyond the first.
      if (until > start) spin([&] { return source->look(); }, [&] { return request.done(); }, start, until, crowded);
      source->end_spin(request.done());
      if (!request.done() && absl::Now() < deadline.at()) slept = source->sleep(request, deadline.at());
    }
    source->end_wait();
    if (request.done() || slept) break;
  }
  if (request.done()) return request.result();
  if (slept || !sleep_on_request(request, deadline.at())) return still_pending();
  return request.result();
}

void ProgressEngine::look(detail::RequestState& request) {
  const std::vector<WaitSource*>& sources = *wait_list_.load(std::memory_order_acquire);
  for (WaitSource* source : sources) {
    if (request.done()) return;
    size_t local_peers = 0;
    if (!source->begin_wait(local_peers)) continue;
    (void)source->look();
    source->end_wait();
  }
}

void ProgressEngine::submit(Job job) {
  detail::MutexLock lock(jobs_mu_);
  jobs_.push_back(std::move(job));
  if (idle_workers_ >= static_cast<int>(jobs_.size())) {
    jobs_cv_.notify_one();
    return;
  }
  if (workers_ < max_workers()) {
    ++workers_;
    detail::MutexLock threads_lock(mu_);
    threads_.emplace_back([this] { worker_loop(); });
    return;
  }
  if (idle_workers_ > 0) jobs_cv_.notify_one();
  if (!warned_full_) {
    warned_full_ = true;
    CASTMESH_LOG_WARN("castmesh-progress: all {} progress workers are busy; further blocking data-plane jobs queue "
                      "(progress_max_workers, CASTMESH_PROGRESS_MAX_WORKERS, raises the limit)",
                      max_workers());
  }
}

void ProgressEngine::worker_loop() {
  platform::set_current_thread_name("castmesh-work");
  while (true) {
    Job job;
    {
      detail::MutexLock lock(jobs_mu_);
      ++idle_workers_;
      jobs_cv_.wait(lock, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !jobs_.empty(); });
      --idle_workers_;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job.run();
    jobs_run_.fetch_add(1, std::memory_order_relaxed);
  }
}

void ProgressEngine::background_loop() {
  platform::set_current_thread_name("castmesh-progress");
  std::vector<BackgroundSource*> sources;
  std::vector<detail::FutexWaitItem> items;
  items.reserve(detail::kFutexWaitAnyMax);
  while (true) {
    {
      detail::MutexLock lock(mu_);
      sources = background_;
    }
    bool busy = false;
    for (BackgroundSource* source : sources) busy |= source->run_once();
    if (busy) {
      background_rounds_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const uint32_t seen = background_bell_.load(std::memory_order_acquire);
    items.clear();
    items.push_back(detail::FutexWaitItem{&background_bell_, seen, /*shared=*/false});
    absl::Duration nap = kBackgroundNap;
    bool ready = false;
    for (BackgroundSource* source : sources) ready |= source->arm(items, nap);
    if (!ready) {
      background_sleeps_.fetch_add(1, std::memory_order_relaxed);
      const absl::Time until = absl::Now() + nap;
      const detail::FutexWaitAny slept =
          detail::futex_wait_any(items.data(), static_cast<int>(items.size()), until);
      if (slept == detail::FutexWaitAny::kUnsupported) {
        // No sleep on several words here (not Linux 5.16+): short naps on the
        // engine's own bell, so a data path's wake-up is seen within 1 ms.
        (void)detail::futex_wait(&background_bell_, seen, std::min(until, absl::Now() + absl::Milliseconds(1)));
      }
    }
    for (BackgroundSource* source : sources) source->disarm();
  }
}

ProgressStats ProgressEngine::stats() {
  ProgressStats s;
  {
    detail::MutexLock lock(jobs_mu_);
    s.workers = workers_;
  }
  {
    detail::MutexLock lock(mu_);
    s.services = services_;
  }
  s.jobs_run = jobs_run_.load(std::memory_order_relaxed);
  s.jobs_cancelled = g_jobs_cancelled.load(std::memory_order_relaxed);
  s.background_rounds = background_rounds_.load(std::memory_order_relaxed);
  s.background_sleeps = background_sleeps_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace castmesh::progress
