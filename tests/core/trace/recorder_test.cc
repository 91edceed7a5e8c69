#include "core/trace/recorder.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace castmesh::trace {
namespace {

// The records this thread made since the last take (other threads' rings
// are left out: the test runner's threads may record too).
ThreadRecords mine(const std::vector<ThreadRecords>& all, pid_t tid) {
  for (const ThreadRecords& t : all) {
    if (t.tid == tid) return t;
  }
  return {};
}

pid_t my_tid() { return static_cast<pid_t>(gettid()); }

class RecorderTest : public ::testing::Test {
 protected:
  void TearDown() override {
    set_recording(false, 0);
    (void)take_records();
  }
};

TEST_F(RecorderTest, NothingIsRecordedWhileOff) {
  set_recording(false, 0);
  (void)take_records();
  slice(Category::kUser, intern("off"), 1, 2);
  EXPECT_TRUE(mine(take_records(), my_tid()).records.empty());
}

TEST_F(RecorderTest, RecordsComeBackInOrderWithTheirFields) {
  set_recording(true, 1024);
  const uint32_t name = intern("step");
  const uint32_t detail = intern("actor A");
  slice(Category::kHandler, name, 100, 250, 7, detail);
  flow(Category::kSend, RecordKind::kFlowOut, name, 42, 260);
  ThreadRecords got = mine(take_records(), my_tid());
  ASSERT_EQ(got.records.size(), 2u);
  EXPECT_EQ(got.records[0].start_ns, 100);
  EXPECT_EQ(got.records[0].duration_ns, 150);
  EXPECT_EQ(got.records[0].value, 7u);
  EXPECT_EQ(got.records[0].name, name);
  EXPECT_EQ(got.records[0].detail, detail);
  EXPECT_EQ(got.records[0].category, Category::kHandler);
  EXPECT_EQ(got.records[1].kind, RecordKind::kFlowOut);
  EXPECT_EQ(got.records[1].flow, 42u);
  EXPECT_EQ(got.dropped, 0u);
  // A take empties the rings.
  EXPECT_TRUE(mine(take_records(), my_tid()).records.empty());
}

TEST_F(RecorderTest, AFullRingDropsTheOldestAndCountsThem) {
  // A fresh thread makes its ring with this capacity.
  set_recording(true, 64);
  pid_t tid = 0;
  std::thread writer([&] {
    tid = my_tid();
    for (int i = 0; i < 200; ++i) slice(Category::kUser, intern("n"), i, i + 1);
  });
  writer.join();
  ThreadRecords got = mine(take_records(), tid);
  ASSERT_EQ(got.records.size(), 64u);
  EXPECT_EQ(got.dropped, 136u);
  EXPECT_EQ(got.records.front().start_ns, 136);  // the newest 64 are kept
  EXPECT_EQ(got.records.back().start_ns, 199);
}

TEST_F(RecorderTest, RecordsOfAThreadThatEndedAreKept) {
  set_recording(true, 128);
  pid_t tid = 0;
  std::thread([&] {
    tid = my_tid();
    slice(Category::kUser, intern("ended"), 5, 6);
  }).join();
  EXPECT_EQ(mine(take_records(), tid).records.size(), 1u);
}

TEST_F(RecorderTest, TakingWhileThreadsRecordLosesNothingButCountedDrops) {
  set_recording(true, 4096);
  constexpr int kThreads = 4;
  constexpr int kEach = 20000;
  std::atomic<int> done{0};
  std::vector<pid_t> tids(kThreads);
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      tids[t] = my_tid();
      const uint32_t name = intern("w");
      for (int i = 0; i < kEach; ++i) slice(Category::kUser, name, i, i + 1, static_cast<uint64_t>(i));
      done.fetch_add(1);
    });
  }
  std::vector<std::vector<ThreadRecords>> takes;
  while (done.load() < kThreads) takes.push_back(take_records());
  for (std::thread& w : writers) w.join();
  takes.push_back(take_records());
  for (int t = 0; t < kThreads; ++t) {
    uint64_t seen = 0;
    uint64_t dropped = 0;
    int64_t last = -1;
    for (const std::vector<ThreadRecords>& take : takes) {
      ThreadRecords got = mine(take, tids[t]);
      dropped += got.dropped;
      for (const Record& r : got.records) {
        // Whole records only, each once, in order.
        EXPECT_EQ(r.duration_ns, 1);
        EXPECT_EQ(r.value, static_cast<uint64_t>(r.start_ns));
        EXPECT_GT(r.start_ns, last);
        last = r.start_ns;
        ++seen;
      }
    }
    EXPECT_EQ(seen + dropped, static_cast<uint64_t>(kEach)) << "thread " << t;
  }
}

TEST_F(RecorderTest, InternGivesOneIdPerText) {
  const uint32_t a = intern("alpha");
  EXPECT_EQ(intern("alpha"), a);
  EXPECT_NE(intern("beta"), a);
  EXPECT_EQ(intern(""), 0u);
  std::vector<std::string> texts = interned_texts();
  ASSERT_GT(texts.size(), a);
  EXPECT_EQ(texts[a], "alpha");
}

TEST_F(RecorderTest, FlowIdsAreUniqueAndNonZero) {
  const uint64_t a = new_flow_id();
  const uint64_t b = new_flow_id();
  EXPECT_NE(a, 0u);
  EXPECT_NE(a, b);
}

TEST_F(RecorderTest, AHandlerNameIsTakenOnceAndOnlyByItsThread) {
  EXPECT_EQ(take_handler_name(), 0u);
  const uint32_t name = intern("Worker.ping");
  name_current_handler(name);
  uint32_t other_thread_saw = 1;
  std::thread([&] { other_thread_saw = take_handler_name(); }).join();
  EXPECT_EQ(other_thread_saw, 0u);
  EXPECT_EQ(take_handler_name(), name);
  EXPECT_EQ(take_handler_name(), 0u);  // cleared: the next handler is named by its message type
}

TEST_F(RecorderTest, AnInstantIsAPointWithItsDetail) {
  set_recording(true, 1024);
  instant(Category::kSupervision, intern("proc lost"), 500, 0, intern("proc p1"));
  ThreadRecords got = mine(take_records(), my_tid());
  ASSERT_EQ(got.records.size(), 1u);
  EXPECT_EQ(got.records[0].kind, RecordKind::kInstant);
  EXPECT_EQ(got.records[0].start_ns, 500);
  EXPECT_EQ(got.records[0].duration_ns, 0);
  EXPECT_EQ(got.records[0].category, Category::kSupervision);
  EXPECT_EQ(got.records[0].detail, intern("proc p1"));
}

}  // namespace
}  // namespace castmesh::trace
