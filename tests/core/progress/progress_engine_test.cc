// The progress engine: a waiting caller moves bytes itself through a wait
// source (here a FAKE source: a token ring in this process's memory, no
// data path), oversubscribed waiters (4 on one core) all make progress,
// strands keep order on reused workers, and cancelling a strand fails what
// had not started without running it.
#include "core/progress/progress_engine.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "core/progress/request_state.h"
#include "core/progress/wait_policy.h"
#include "core/scheduler/futex.h"

namespace castmesh::progress {
namespace {

// A FAKE wait source: "bytes" are tokens on a ring of waiters in this
// process. Waiter i's request completes only when that waiter's own look
// finds the token at i; it then passes the token on. Nothing else
// completes a request, so a wait that does not look never ends.
class FakeTokenRing : public WaitSource {
 public:
  explicit FakeTokenRing(int waiters) : waiters_(waiters) {}

  // The waiter this thread is, and the request it waits for.
  static thread_local int t_index;
  static thread_local detail::RequestState* t_request;

  std::atomic<bool> active{true};
  std::atomic<uint32_t> token{0};
  std::atomic<uint64_t> looks{0};
  std::atomic<uint64_t> passes{0};

  bool begin_wait(size_t& local_peers) override {
    if (!active.load() || t_request == nullptr) return false;
    local_peers = static_cast<size_t>(waiters_ - 1);
    return true;
  }
  absl::Duration spin_budget(bool) override { return absl::Milliseconds(1); }
  Look look() override {
    looks.fetch_add(1);
    Look result;
    if (token.load(std::memory_order_acquire) == static_cast<uint32_t>(t_index) && !t_request->done()) {
      t_request->complete(MessageStatus{});
      passes.fetch_add(1);
      token.store(static_cast<uint32_t>((t_index + 1) % waiters_), std::memory_order_release);
      detail::futex_wake(&token, INT32_MAX);
      result.handled = true;
    }
    return result;
  }
  bool sleep(detail::RequestState& request, absl::Time deadline) override {
    while (!request.done() && absl::Now() < deadline) {
      const uint32_t seen = token.load(std::memory_order_acquire);
      if (look().handled) break;
      (void)detail::futex_wait(&token, seen, std::min(deadline, absl::Now() + absl::Milliseconds(5)));
    }
    return true;
  }
  void end_wait() override {}

 private:
  const int waiters_;
};
thread_local int FakeTokenRing::t_index = -1;
thread_local detail::RequestState* FakeTokenRing::t_request = nullptr;

// Sources are registered for the life of the process: each test's fake is
// switched off when it ends.
struct Registered {
  explicit Registered(int waiters) : ring(new FakeTokenRing(waiters)) {
    ProgressEngine::instance().add_wait_source(ring, /*rank=*/-1);
  }
  ~Registered() { ring->active = false; }
  FakeTokenRing* ring;  // leaked: the engine keeps the pointer
};

// One waiter: its request completes only through its own looks, so the
// wait ends only because the engine let the waiting thread drive the source.
TEST(ProgressEngine, AWaiterMovesTheBytesItself) {
  Registered fake(1);
  auto request = std::make_shared<detail::RequestState>();
  FakeTokenRing::t_index = 0;
  FakeTokenRing::t_request = request.get();
  absl::StatusOr<MessageStatus> got = request->wait(absl::Minutes(1));
  FakeTokenRing::t_request = nullptr;
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(fake.ring->passes.load(), 1u);
  EXPECT_GE(fake.ring->looks.load(), 1u);
}

// A wait whose source never completes it ends with kDeadlineExceeded at the
// deadline, after looking, and stays pending.
TEST(ProgressEngine, AWaitThatNothingCompletesTimesOutAndStaysPending) {
  Registered fake(2);
  fake.ring->token = 1;  // never this waiter's turn
  auto request = std::make_shared<detail::RequestState>();
  FakeTokenRing::t_index = 0;
  FakeTokenRing::t_request = request.get();
  absl::StatusOr<MessageStatus> got = request->wait(absl::Milliseconds(20));
  FakeTokenRing::t_request = nullptr;
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_FALSE(request->done());
  EXPECT_GT(fake.ring->looks.load(), 0u);
  EXPECT_FALSE(request->test().has_value());
}

// Four waiters pass a token round 200 times while all four threads share
// one core: each waits through the engine for a token only the previous one
// hands on. A spinner that kept the core would stall the others; the
// policy sees 4 procs' worth of waiters on too few cores and gives the core
// away, so every pass completes.
TEST(ProgressEngine, FourWaitersOnOneCoreAllMakeProgress) {
  constexpr int kWaiters = 4;
  constexpr int kRounds = 200;
  Registered fake(kWaiters);
  ASSERT_TRUE(oversubscribed(kWaiters - 1) || cores() >= kWaiters);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([i, &failures] {
#if defined(__linux__)
      // Every waiter on the first CPU this process may use.
      cpu_set_t allowed, one;
      CPU_ZERO(&one);
      if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) {
        for (int c = 0; c < CPU_SETSIZE; ++c) {
          if (CPU_ISSET(c, &allowed)) {
            CPU_SET(c, &one);
            break;
          }
        }
        (void)sched_setaffinity(0, sizeof one, &one);
      }
#endif
      FakeTokenRing::t_index = i;
      for (int round = 0; round < kRounds; ++round) {
        auto request = std::make_shared<detail::RequestState>();
        FakeTokenRing::t_request = request.get();
        if (!request->wait(absl::Minutes(1)).ok()) failures.fetch_add(1);
        FakeTokenRing::t_request = nullptr;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(fake.ring->passes.load(), uint64_t{kWaiters} * kRounds);
}

// Jobs of one strand run one at a time in the order posted, on workers that
// are reused: 300 jobs make at most one new worker thread.
TEST(ProgressEngine, AStrandRunsItsJobsInOrderOnReusedWorkers) {
  ProgressEngine& engine = ProgressEngine::instance();
  const int workers_before = engine.stats().workers;
  auto strand = std::make_shared<Strand>("test strand");
  std::vector<int> order;
  std::atomic<int> running{0}, overlaps{0};
  auto done = std::make_shared<detail::RequestState>();
  constexpr int kJobs = 300;
  for (int i = 0; i < kJobs; ++i) {
    strand->post(Job{[i, &order, &running, &overlaps, done] {
                       if (running.fetch_add(1) != 0) overlaps.fetch_add(1);
                       order.push_back(i);  // one job at a time: no lock needed
                       running.fetch_sub(1);
                       if (i == kJobs - 1) done->complete(MessageStatus{});
                     },
                     {}});
  }
  ASSERT_TRUE(done->wait(absl::Minutes(1)).ok());
  EXPECT_EQ(overlaps.load(), 0);
  ASSERT_EQ(order.size(), size_t{kJobs});
  for (int i = 0; i < kJobs; ++i) ASSERT_EQ(order[i], i);
  EXPECT_LE(engine.stats().workers - workers_before, 1);
}

// cancel_pending fails the jobs that have not started (their cancel runs,
// their run never does) and leaves the running one alone.
TEST(ProgressEngine, CancellingAStrandFailsWhatHasNotStarted) {
  auto strand = std::make_shared<Strand>("test strand");
  std::atomic<uint32_t> gate{0};
  std::atomic<bool> first_started{false}, first_finished{false};
  std::atomic<int> later_ran{0};
  std::vector<absl::Status> cancelled;
  detail::Mutex mu;
  strand->post(Job{[&] {
                     first_started = true;
                     while (gate.load() == 0) (void)detail::futex_wait(&gate, 0, absl::Now() + absl::Seconds(1));
                     first_finished = true;
                   },
                   {}});
  for (int i = 0; i < 2; ++i) {
    strand->post(Job{[&] { later_ran.fetch_add(1); },
                     [&](const absl::Status& why) {
                       detail::MutexLock lock(mu);
                       cancelled.push_back(why);
                     }});
  }
  while (!first_started.load()) std::this_thread::yield();
  EXPECT_TRUE(strand->cancel_pending(absl::CancelledError("the test cancelled it")));
  gate = 1;
  detail::futex_wake(&gate, 1);
  while (!first_finished.load()) std::this_thread::yield();
  // After the strand is idle, a cancel finds nothing.
  while (strand->cancel_pending(absl::CancelledError("again"))) std::this_thread::yield();
  EXPECT_EQ(later_ran.load(), 0);
  detail::MutexLock lock(mu);
  ASSERT_EQ(cancelled.size(), 2u);
  for (const absl::Status& st : cancelled) {
    EXPECT_EQ(st.code(), absl::StatusCode::kCancelled);
    EXPECT_EQ(st.message(), "the test cancelled it");
  }
}

}  // namespace
}  // namespace castmesh::progress
