#include "core/mailbox/mailbox.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <utility>
#include <vector>

namespace castmesh::detail {
namespace {

using Result = Mailbox::PushResult;

Envelope* numbered(int n) {
  auto* e = new TypedEnvelope<int>(n);
  return e;
}
int number(Envelope* e) { return static_cast<TypedEnvelope<int>*>(e)->value; }

TEST(Mailbox, FirstPushUnblocksThenFifo) {
  Mailbox m;
  EXPECT_EQ(m.push(numbered(1)), Result::kUnblocked);  // starts blocked: caller schedules
  EXPECT_EQ(m.push(numbered(2)), Result::kOk);
  EXPECT_EQ(m.push(numbered(3)), Result::kOk);
  for (int want = 1; want <= 3; ++want) {
    Envelope* e = m.pop();
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(number(e), want);
    delete e;
  }
  EXPECT_EQ(m.pop(), nullptr);
  EXPECT_TRUE(m.try_block());
  EXPECT_EQ(m.push(numbered(4)), Result::kUnblocked);  // blocked again: exactly one reschedule
  EXPECT_FALSE(m.try_block());                          // not empty
  delete m.pop();
}

TEST(Mailbox, CloseReturnsQueuedInOrderAndRefusesPushes) {
  Mailbox m;
  m.mark_scheduled();
  for (int i = 0; i < 5; ++i) m.push(numbered(i));
  delete m.pop();  // 0 handled; 1..4 remain (partly in the consumer cache)
  m.push(numbered(5));
  Envelope* rest = m.close();
  int want = 1;
  while (rest) {
    Envelope* next = rest->next;
    EXPECT_EQ(number(rest), want++);
    delete rest;
    rest = next;
  }
  EXPECT_EQ(want, 6);
  Envelope* late = numbered(9);
  EXPECT_EQ(m.push(late), Result::kClosed);  // caller keeps ownership
  delete late;
  EXPECT_TRUE(m.closed());
}

TEST(Mailbox, ManyProducersKeepPerProducerOrderAndScheduleOncePerBlock) {
  Mailbox m;
  constexpr int kProducers = 4, kPer = 20000;
  std::atomic<int> unblocks{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kPer; ++i) {
        if (m.push(numbered(p * kPer + i)) == Result::kUnblocked) unblocks.fetch_add(1);
      }
    });
  }
  std::vector<int> last(kProducers, -1);
  int received = 0, violations = 0;
  int blocks = 0;
  // Consumer: only runs while "scheduled" (an unblock it has not consumed).
  while (received < kProducers * kPer) {
    if (unblocks.load() <= blocks) {
      std::this_thread::yield();
      continue;
    }
    while (Envelope* e = m.pop()) {
      const int v = number(e);
      const int p = v / kPer;
      if (v % kPer <= last[p]) ++violations;
      last[p] = v % kPer;
      ++received;
      delete e;
    }
    if (m.try_block()) ++blocks;
  }
  for (auto& t : producers) t.join();
  EXPECT_EQ(violations, 0);
  EXPECT_EQ(received, kProducers * kPer);
  // Every unblock was matched by one block (no lost or double wake-up): the
  // consumer ended either blocked, or scheduled with an empty mailbox.
  const int u = unblocks.load();
  EXPECT_TRUE(u == blocks || (u == blocks + 1 && m.try_block())) << u << " unblocks, " << blocks << " blocks";
}

// Pushes and pops across many segment boundaries (the first segment is built
// in, later ones are allocated and freed), blocking whenever it is empty.
TEST(Mailbox, FifoAcrossSegmentBoundaries) {
  Mailbox m;
  m.mark_scheduled();
  const int kSlots = static_cast<int>(Mailbox::kSlots);
  int next_push = 0, next_pop = 0;
  for (int round : {1, kSlots - 1, kSlots, kSlots + 1, 2 * kSlots, 3 * kSlots + 7, 5}) {
    for (int i = 0; i < round; ++i) ASSERT_NE(m.push(numbered(next_push++)), Result::kClosed);
    EXPECT_TRUE(m.has_messages());
    EXPECT_FALSE(m.try_block());
    while (Envelope* e = m.pop()) {
      EXPECT_EQ(number(e), next_pop++);
      delete e;
    }
    EXPECT_EQ(next_pop, next_push);
    EXPECT_FALSE(m.has_messages());
    EXPECT_TRUE(m.try_block());
    EXPECT_EQ(m.push(numbered(next_push++)), Result::kUnblocked);
    Envelope* e = m.pop();
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(number(e), next_pop++);
    delete e;
  }
}

TEST(Mailbox, CloseAcrossSegmentsReturnsRestInOrder) {
  Mailbox m;
  m.mark_scheduled();
  const int total = 4 * static_cast<int>(Mailbox::kSlots) + 3;
  for (int i = 0; i < total; ++i) m.push(numbered(i));
  const int popped = static_cast<int>(Mailbox::kSlots) + 10;
  for (int i = 0; i < popped; ++i) delete m.pop();
  int want = popped;
  for (Envelope* rest = m.close(); rest != nullptr;) {
    Envelope* next = rest->next;
    EXPECT_EQ(number(rest), want++);
    delete rest;
    rest = next;
  }
  EXPECT_EQ(want, total);
  Envelope* late = numbered(-1);
  EXPECT_EQ(m.push(late), Result::kClosed);
  delete late;
}

// A mailbox destroyed with messages in several segments deletes them all
// (LeakSanitizer checks this in the asan preset).
TEST(Mailbox, DestructorDeletesQueuedMessagesAndSegments) {
  Mailbox m;
  for (int i = 0; i < 3 * static_cast<int>(Mailbox::kSlots) + 1; ++i) m.push(numbered(i));
  for (int i = 0; i < 5; ++i) delete m.pop();
}

// The actor protocol itself: whichever producer gets kUnblocked becomes the
// consumer (as if the scheduler ran the actor on its thread) and drains until
// try_block succeeds. Exactly one consumer at a time (checked), no message
// lost, FIFO per producer.
TEST(Mailbox, UnblockHandsOffConsumerExactlyOnceUnderContention) {
  Mailbox m;
  constexpr int kProducers = 6, kPer = 30000;
  std::atomic<int> consumers_inside{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> received{0};
  std::vector<int> last(kProducers, -1);  // consumer-only, handed over with the mailbox
  int violations = 0;                     // consumer-only
  auto consume = [&] {
    if (consumers_inside.fetch_add(1) != 0) overlaps.fetch_add(1);
    for (;;) {
      while (Envelope* e = m.pop()) {
        const int v = number(e);
        if (v % kPer <= last[v / kPer]) ++violations;
        last[v / kPer] = v % kPer;
        received.fetch_add(1, std::memory_order_relaxed);
        delete e;
      }
      consumers_inside.fetch_sub(1);
      if (m.try_block()) return;
      if (consumers_inside.fetch_add(1) != 0) overlaps.fetch_add(1);
    }
  };
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kPer; ++i) {
        if (m.push(numbered(p * kPer + i)) == Result::kUnblocked) consume();
      }
    });
  }
  for (auto& t : producers) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(received.load(), kProducers * kPer);
  EXPECT_EQ(violations, 0);
  EXPECT_FALSE(m.has_messages());
}

// Close while producers push: every message is either refused (kClosed, the
// sender keeps it) or consumed exactly once, by pop or in close's list.
TEST(Mailbox, CloseUnderContentionLosesNothing) {
  Mailbox m;
  m.mark_scheduled();
  constexpr int kProducers = 4, kPer = 20000;
  std::atomic<int> accepted{0}, refused{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < kPer; ++i) {
        Envelope* e = numbered(p * kPer + i);
        if (m.push(e) == Result::kClosed) {
          delete e;
          refused.fetch_add(1);
        } else {
          accepted.fetch_add(1);
        }
      }
    });
  }
  go = true;
  int consumed = 0, violations = 0;
  std::vector<int> last(kProducers, -1);
  auto check = [&](Envelope* e) {
    const int v = number(e);
    if (v % kPer <= last[v / kPer]) ++violations;
    last[v / kPer] = v % kPer;
    ++consumed;
    delete e;
  };
  while (consumed < kPer) {
    if (Envelope* e = m.pop()) check(e);
  }
  for (Envelope* rest = m.close(); rest != nullptr;) check(std::exchange(rest, rest->next));
  for (auto& t : producers) t.join();
  EXPECT_EQ(violations, 0);
  EXPECT_EQ(consumed, accepted.load());
  EXPECT_EQ(accepted.load() + refused.load(), kProducers * kPer);
  EXPECT_EQ(m.pop(), nullptr);
}

}  // namespace
}  // namespace castmesh::detail
