// ShmRing: records keep their bytes and order across wrap-around, records
// that exactly fill the ring, a full ring refuses and recovers, many
// producers' sequences (serialised) arrive in order through the doorbell,
// a producer and a sleeping consumer on two mappings of one segment lose no
// record and no wake-up, and a segment that is not a castmesh ring, or a
// corrupted record, is a clear error instead of a crash.
#include "core/shm_link/shm_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"

namespace castmesh::shm_link {
namespace {

std::string pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((seed * 131 + i * 7) & 0xff);
  return s;
}

TEST(ShmRing, WrapAroundKeepsBytesAndOrder) {
  auto ring = ShmRing::Create(4096);
  ASSERT_TRUE(ring.ok()) << ring.status();
  int written = 0, read = 0;
  // Sizes that do not divide the ring, so records land at every offset and
  // some need a skip record at the end.
  while (read < 400) {
    while (written < 400) {
      const size_t n = 1 + (written * 97) % 900;
      if (!(*ring)->try_write(1 + written % 3, std::to_string(written), pattern(n, written))) break;
      ++written;
    }
    auto rec = (*ring)->peek();
    ASSERT_TRUE(rec.ok()) << rec.status();
    ASSERT_TRUE(rec->has_value());
    EXPECT_EQ((*rec)->kind, static_cast<uint32_t>(1 + read % 3));
    EXPECT_EQ((*rec)->meta, std::to_string(read));
    EXPECT_EQ((*rec)->body, pattern(1 + (read * 97) % 900, read)) << "record " << read;
    (*ring)->pop();
    ++read;
  }
  auto rec = (*ring)->peek();
  ASSERT_TRUE(rec.ok());
  EXPECT_FALSE(rec->has_value());
  EXPECT_FALSE((*ring)->readable());
}

TEST(ShmRing, RecordsExactlyFillingTheRing) {
  auto ring = ShmRing::Create(4096);
  ASSERT_TRUE(ring.ok()) << ring.status();
  const size_t half = (*ring)->max_payload();  // a record of exactly half the ring
  ASSERT_EQ(half + ShmRing::kRecordHeaderBytes, 2048u);
  for (int lap = 0; lap < 3; ++lap) {
    ASSERT_TRUE((*ring)->try_write(1, "", pattern(half, lap)));
    ASSERT_TRUE((*ring)->try_write(2, "m", pattern(half - 1, lap + 1)));
    EXPECT_FALSE((*ring)->try_write(1, "", "x")) << "the ring is full";
    for (int i = 0; i < 2; ++i) {
      auto rec = (*ring)->peek();
      ASSERT_TRUE(rec.ok() && rec->has_value());
      EXPECT_EQ((*rec)->body, i == 0 ? pattern(half, lap) : pattern(half - 1, lap + 1));
      (*ring)->pop();
    }
  }
  EXPECT_FALSE((*ring)->try_write(1, "", std::string(half + 1, 'x'))) << "over max_payload";
  EXPECT_FALSE((*ring)->try_write(0, "", "x")) << "kind 0 is the skip record";
}

TEST(ShmRing, FullRingRefusesThenTakesAfterPop) {
  auto ring = ShmRing::Create(4096);
  ASSERT_TRUE(ring.ok());
  ASSERT_TRUE((*ring)->try_write(1, "", std::string(1500, 'a')));
  ASSERT_TRUE((*ring)->try_write(1, "", std::string(1500, 'b')));
  // 3040 bytes used: a third record of 1500 would need to wrap past the head.
  EXPECT_FALSE((*ring)->try_write(1, "", std::string(1500, 'c')));
  auto rec = (*ring)->peek();
  ASSERT_TRUE(rec.ok() && rec->has_value());
  (*ring)->pop();
  EXPECT_TRUE((*ring)->try_write(1, "", std::string(1500, 'c')));  // wraps with a skip record
  for (char c : {'b', 'c'}) {
    auto r = (*ring)->peek();
    ASSERT_TRUE(r.ok() && r->has_value());
    EXPECT_EQ((*r)->body, std::string(1500, c));
    (*ring)->pop();
  }
}

// Several producer threads (serialised by a lock, as the link's senders
// are) and one consumer that sleeps on the doorbell: every producer's
// sequence arrives complete and in order.
TEST(ShmRing, ManyProducersSequencesThroughTheDoorbell) {
  auto created = ShmRing::Create(8192);
  ASSERT_TRUE(created.ok());
  auto opened = ShmRing::Open((*created)->name());  // the consumer's own mapping
  ASSERT_TRUE(opened.ok()) << opened.status();
  ShmRing& producer = **created;
  ShmRing& consumer = **opened;
  constexpr int kProducers = 4, kEach = 5000;
  std::mutex producer_lock;
  std::vector<std::thread> producers;
  for (int t = 0; t < kProducers; ++t) {
    producers.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        char meta[8];
        std::memcpy(meta, &t, 4);
        std::memcpy(meta + 4, &i, 4);
        const std::string body = pattern(static_cast<size_t>(i % 300), i);
        for (;;) {
          {
            std::lock_guard<std::mutex> lock(producer_lock);
            if (producer.try_write(1, std::string_view(meta, 8), body)) break;
          }
          std::this_thread::yield();
        }
      }
    });
  }
  std::vector<int> next(kProducers, 0);
  int total = 0;
  while (total < kProducers * kEach) {
    auto rec = consumer.peek();
    ASSERT_TRUE(rec.ok()) << rec.status();
    if (!rec->has_value()) {
      consumer.sleep_until_rung(absl::Now() + absl::Milliseconds(100));
      continue;
    }
    int t = 0, i = 0;
    ASSERT_EQ((*rec)->meta.size(), 8u);
    std::memcpy(&t, (*rec)->meta.data(), 4);
    std::memcpy(&i, (*rec)->meta.data() + 4, 4);
    ASSERT_TRUE(t >= 0 && t < kProducers);
    ASSERT_EQ(i, next[t]) << "producer " << t;
    ASSERT_EQ((*rec)->body, pattern(static_cast<size_t>(i % 300), i));
    ++next[t];
    ++total;
    consumer.pop();
  }
  for (auto& p : producers) p.join();
}

TEST(ShmRing, OpenRejectsWhatIsNotARing) {
  auto missing = ShmRing::Open("/castmesh-test-no-such-segment");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_TRUE(absl::IsInvalidArgument(ShmRing::Open("no-slash").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ShmRing::Open("/a/b").status()));

  // A segment of a ring's size whose header is garbage.
  const std::string name = "/castmesh-test-garbage-" + std::to_string(::getpid());
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 4096 + 4096), 0);
  std::vector<char> junk(4096, '\x5a');
  ASSERT_EQ(::write(fd, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  ::close(fd);
  auto bad = ShmRing::Open(name);
  ::shm_unlink(name.c_str());
  ASSERT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("not a castmesh ring"), std::string::npos) << bad.status();

  // A real ring whose size was changed behind its back.
  auto ring = ShmRing::Create(4096);
  ASSERT_TRUE(ring.ok());
  const int fd2 = ::shm_open((*ring)->name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd2, 0);
  ASSERT_EQ(::ftruncate(fd2, 4096 + (1 << 20)), 0);
  ::close(fd2);
  auto resized = ShmRing::Open((*ring)->name());
  ASSERT_TRUE(absl::IsInvalidArgument(resized.status())) << resized.status();
  EXPECT_NE(resized.status().message().find("capacity"), std::string::npos) << resized.status();
}

TEST(ShmRing, CorruptRecordIsDataLoss) {
  auto ring = ShmRing::Create(4096);
  ASSERT_TRUE(ring.ok());
  auto consumer = ShmRing::Open((*ring)->name());
  ASSERT_TRUE(consumer.ok());
  ASSERT_TRUE((*ring)->try_write(1, "h", "body"));
  // Scribble over the record's size word through a third mapping.
  const int fd = ::shm_open((*ring)->name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  void* base = ::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(base, MAP_FAILED);
  const uint32_t huge = 1u << 30;
  std::memcpy(static_cast<char*>(base) + 4096, &huge, 4);
  ::munmap(base, 8192);
  auto rec = (*consumer)->peek();
  EXPECT_TRUE(absl::IsDataLoss(rec.status())) << rec.status();
}

TEST(ShmRing, UnlinkRemovesTheNameButNotTheMapping) {
  auto ring = ShmRing::Create(4096);
  ASSERT_TRUE(ring.ok());
  auto consumer = ShmRing::Open((*ring)->name());
  ASSERT_TRUE(consumer.ok());
  (*consumer)->unlink();
  (*ring)->unlink();  // idempotent on both sides
  EXPECT_TRUE(absl::IsNotFound(ShmRing::Open((*ring)->name()).status()));
  ASSERT_TRUE((*ring)->try_write(7, "", "still mapped"));
  auto rec = (*consumer)->peek();
  ASSERT_TRUE(rec.ok() && rec->has_value());
  EXPECT_EQ((*rec)->body, "still mapped");
}

// The cross-process ring in one process, as the aarch64 stage runs it under
// qemu-user (where worker procs cannot start): one producer thread on the
// creator's mapping, one consumer thread on its own mapping of the segment,
// which sleeps on the doorbell whenever the ring is empty, so every record's
// bytes must be visible once its publication is, and no wake-up may be lost,
// on a weakly ordered CPU too. The consumer's 30 s sleep is only a hang guard:
// reaching it with the ring empty and the producer not done is a lost wake-up.
TEST(ShmRing, OneProducerOneSleepingConsumerOnTwoMappingsLoseNothing) {
  auto created = ShmRing::Create(4096);  // small: the producer often finds it full
  ASSERT_TRUE(created.ok()) << created.status();
  auto opened = ShmRing::Open((*created)->name());
  ASSERT_TRUE(opened.ok()) << opened.status();
  ShmRing& producer = **created;
  ShmRing& consumer = **opened;
  constexpr uint32_t kRecords = 20000;
  std::atomic<bool> produced{false};
  std::thread writer([&] {
    for (uint32_t i = 0; i < kRecords; ++i) {
      const std::string body = pattern(i % 500, static_cast<int>(i));
      const std::string_view meta(reinterpret_cast<const char*>(&i), sizeof(i));
      while (!producer.try_write(1 + i % kMaxKind, meta, body)) std::this_thread::yield();
    }
    produced.store(true);
  });
  uint32_t next = 0;
  int lost_wakeups = 0;
  while (next < kRecords && lost_wakeups == 0) {
    auto rec = consumer.peek();
    ASSERT_TRUE(rec.ok()) << rec.status();
    if (!rec->has_value()) {
      const absl::Time guard = absl::Now() + absl::Seconds(30);
      consumer.sleep_until_rung(guard);
      if (absl::Now() >= guard && !consumer.readable() && !produced.load()) ++lost_wakeups;
      continue;
    }
    uint32_t seq = 0;
    ASSERT_EQ((*rec)->meta.size(), sizeof(seq));
    std::memcpy(&seq, (*rec)->meta.data(), sizeof(seq));
    ASSERT_EQ(seq, next);
    ASSERT_EQ((*rec)->kind, 1 + seq % kMaxKind);
    ASSERT_EQ((*rec)->body, pattern(seq % 500, static_cast<int>(seq))) << "record " << seq;
    consumer.pop();
    ++next;
  }
  writer.join();
  EXPECT_EQ(lost_wakeups, 0) << "the consumer slept 30 s on an empty ring while the producer was blocked";
  EXPECT_EQ(next, kRecords);
}

TEST(ShmRing, CreateRejectsBadCapacities) {
  EXPECT_TRUE(absl::IsInvalidArgument(ShmRing::Create(5000).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ShmRing::Create(1024).status()));
}

}  // namespace
}  // namespace castmesh::shm_link
