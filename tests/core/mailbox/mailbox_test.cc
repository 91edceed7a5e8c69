#include "core/mailbox/mailbox.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
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

}  // namespace
}  // namespace castmesh::detail
