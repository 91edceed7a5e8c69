// SlotCollector: N slots filled from many threads finish exactly once, with
// every value in slot order, or at the first failure.
#include "castmesh/detail/slot_collector.h"

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

namespace castmesh::detail {
namespace {

constexpr size_t kThreads = 8;

// Runs body(t) for t = 0 .. kThreads-1 on as many threads, released
// together so that they race, and joins them.
template <typename Body>
void race(Body body) {
  std::barrier start(kThreads);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      body(t);
    });
  }
  for (auto& th : threads) th.join();
}

TEST(SlotCollector, ManyThreadsFillingSlotsFinishOnceInSlotOrder) {
  constexpr size_t kSlots = 4000;
  for (int round = 0; round < 20; ++round) {
    SlotCollector<size_t> slots(kSlots);
    std::atomic<int> finishes{0};
    std::atomic<size_t> stored{0};
    std::vector<size_t> result;
    race([&](size_t t) {
      // Every thread tries every slot (half of them from the other end), so
      // each slot is raced for: exactly one value per slot may be stored.
      for (size_t i = 0; i < kSlots; ++i) {
        const size_t slot = t % 2 == 0 ? i : kSlots - 1 - i;
        SlotFill<size_t> fill = slots.set(slot, slot * 10 + t);
        if (fill.stored) stored++;
        if (fill.done) {
          finishes++;
          result = *std::move(fill.done);
        }
      }
    });
    ASSERT_EQ(finishes.load(), 1);
    ASSERT_EQ(stored.load(), kSlots);
    ASSERT_EQ(result.size(), kSlots);
    for (size_t i = 0; i < kSlots; ++i) ASSERT_EQ(result[i] / 10, i) << "slot " << i;
    EXPECT_FALSE(slots.set(0, 1).stored);  // finished: ignored
    EXPECT_FALSE(slots.fail());
  }
}

TEST(SlotCollector, FirstFailureWinsAgainstRacingFillsAndFailures) {
  constexpr size_t kSlots = 64;
  for (int round = 0; round < 200; ++round) {
    SlotCollector<int> slots(kSlots);
    std::atomic<int> finishes{0}, failures_won{0};
    race([&](size_t t) {
      for (size_t i = t; i < kSlots; i += kThreads) {
        // Thread 0 fails half-way through its share; the others fill.
        if (t == 0 && i >= kSlots / 2) {
          if (slots.fail()) failures_won++;
        } else if (slots.set(i, static_cast<int>(i)).done) {
          finishes++;
        }
      }
      if (t == 1 && slots.fail()) failures_won++;  // a second, racing failure
    });
    // Thread 0 never fills its last slots, so no fill can finish it: the
    // first failure does, once, and every later call is ignored.
    EXPECT_EQ(finishes.load(), 0);
    EXPECT_EQ(failures_won.load(), 1);
    EXPECT_FALSE(slots.set(kSlots - 1, 0).stored);
  }
}

TEST(SlotCollector, ARunCountsForTheSlotsItStandsForOnce) {
  SlotCollector<std::string> slots(5);
  EXPECT_TRUE(slots.set(3, "d").stored);
  SlotFill<std::string> run = slots.set(1, "bcd", 3);  // covers 1..3; 3 was filled already
  EXPECT_TRUE(run.stored);
  EXPECT_FALSE(run.done);
  EXPECT_FALSE(slots.set(2, "c").stored);  // covered by the run
  SlotFill<std::string> tail = slots.set(4, "tail", 9);  // clipped at the last slot
  EXPECT_TRUE(tail.stored);
  EXPECT_FALSE(tail.done);
  SlotFill<std::string> last = slots.set(0, "a");
  ASSERT_TRUE(last.done);
  EXPECT_EQ(*last.done, (std::vector<std::string>{"a", "bcd", "d", "tail"}));
}

TEST(SlotCollector, OnlyTheFirstFailureFinishes) {
  SlotCollector<int> slots(3);
  EXPECT_TRUE(slots.set(0, 1).stored);
  EXPECT_TRUE(slots.fail());   // this caller reports its error
  EXPECT_FALSE(slots.fail());  // a later error is dropped
  EXPECT_FALSE(slots.set(1, 2).stored);
  EXPECT_FALSE(slots.set(2, 3).done);
}

TEST(SlotCollector, FailingAfterTheLastFillIsIgnored) {
  SlotCollector<int> slots(2);
  EXPECT_FALSE(slots.set(0, 1).done);
  EXPECT_TRUE(slots.set(1, 2).done);
  EXPECT_FALSE(slots.fail());
}

}  // namespace
}  // namespace castmesh::detail
