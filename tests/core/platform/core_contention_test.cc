// The contention signal of a spinning waiter (core/platform/core_contention.h):
// a thread that shares its core with a busy thread sees its involuntary
// switches rise. No timing decides the outcome: the test waits (bounded only
// against a hang) until the scheduler has preempted the thread once.
#include "core/platform/core_contention.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace castmesh::platform {
namespace {

TEST(CoreContention, FirstLookReportsNothing) {
  CoreContention contention;
  EXPECT_EQ(contention.switches_since_last(), 0u);
}

#if defined(__linux__)
// Pins the calling thread to `cpu`; false where the system refuses.
bool pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

TEST(CoreContention, RisesWhileABusyThreadSharesTheCore) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed)) ++cpu;
  ASSERT_LT(cpu, CPU_SETSIZE);

  std::atomic<bool> stop{false};
  std::atomic<bool> pinned{false};
  std::atomic<bool> refused{false};
  std::thread busy([&] {
    if (!pin_to(cpu)) refused.store(true);
    pinned.store(true);
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  while (!pinned.load()) std::this_thread::yield();
  const bool here = pin_to(cpu);
  if (refused.load() || !here) {
    stop.store(true);
    busy.join();
    (void)pthread_setaffinity_np(pthread_self(), sizeof allowed, &allowed);
    GTEST_SKIP() << "this system refuses to pin threads to a CPU";
  }

  CoreContention contention;
  (void)contention.switches_since_last();
  // Spins on the shared core: the scheduler must switch this thread off for
  // the busy one sooner or later (the bound only guards against a hang).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool rose = false;
  while (!rose && std::chrono::steady_clock::now() < give_up) rose = contention.switches_since_last() > 0;
  stop.store(true);
  busy.join();
  (void)pthread_setaffinity_np(pthread_self(), sizeof allowed, &allowed);
  EXPECT_TRUE(rose) << "never switched off a core shared with a busy thread";
  EXPECT_GT(involuntary_switches(), 0u);
}
#endif

}  // namespace
}  // namespace castmesh::platform
