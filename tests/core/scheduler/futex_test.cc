// The futex contract (futex.h) for both implementations in every build:
// "futex" is what this build uses (the Linux system call, or the parking lot
// in a CASTMESH_POSIX_FALLBACKS build or off Linux), "parking_lot" is the
// portable fallback called directly. A lost wake-up shows as a failed
// bounded wait (kHangGuard), never as a hang.
#include <gtest/gtest.h>

#include <absl/time/clock.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <ostream>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "core/scheduler/futex.h"
#include "core/scheduler/parking_lot.h"

namespace castmesh::detail {
namespace {

// Far longer than any wake-up takes: reaching it means a wake-up was lost.
constexpr absl::Duration kHangGuard = absl::Seconds(30);

struct Impl {
  std::string name;
  bool (*wait)(std::atomic<uint32_t>*, uint32_t, absl::Time);
  void (*wake)(std::atomic<uint32_t>*, int);
};

void PrintTo(const Impl& impl, std::ostream* os) { *os << impl.name; }

void parking_lot_wake_void(std::atomic<uint32_t>* word, int count) { (void)parking_lot_wake(word, count); }

class Futex : public ::testing::TestWithParam<Impl> {
 protected:
  bool wait(std::atomic<uint32_t>* word, uint32_t expected, absl::Time deadline) {
    return GetParam().wait(word, expected, deadline);
  }
  void wake(std::atomic<uint32_t>* word, int count) { GetParam().wake(word, count); }

  // Blocks until *word != expected, re-waiting after spurious returns; false
  // when kHangGuard passed first.
  bool wait_until_changed(std::atomic<uint32_t>* word, uint32_t expected) {
    const absl::Time deadline = absl::Now() + kHangGuard;
    while (word->load(std::memory_order_seq_cst) == expected) {
      if (!wait(word, expected, deadline) && word->load(std::memory_order_seq_cst) == expected) return false;
    }
    return true;
  }
};

TEST_P(Futex, ReturnsAtOnceWhenTheWordAlreadyDiffers) {
  std::atomic<uint32_t> word{1};
  EXPECT_TRUE(wait(&word, 0, absl::InfiniteFuture()));
  EXPECT_TRUE(wait(&word, 0, absl::Now() + absl::Hours(1)));
}

TEST_P(Futex, WakeWithNobodyWaitingIsHarmless) {
  std::atomic<uint32_t> word{0};
  wake(&word, 1);
  wake(&word, INT_MAX);
  // A store and wake before the wait: the wait sees the new value.
  word.store(1, std::memory_order_seq_cst);
  wake(&word, 1);
  EXPECT_TRUE(wait(&word, 0, absl::InfiniteFuture()));
}

TEST_P(Futex, DeadlineInThePastTimesOutAtOnce) {
  std::atomic<uint32_t> word{0};
  EXPECT_FALSE(wait(&word, 0, absl::Now() - absl::Seconds(1)));
  EXPECT_FALSE(wait(&word, 0, absl::InfinitePast()));
}

TEST_P(Futex, TimesOutNoEarlierThanTheDeadline) {
  std::atomic<uint32_t> word{0};
  const absl::Time deadline = absl::Now() + absl::Milliseconds(50);
  bool timed_out = false;
  // Spurious returns are allowed: wait again until it reports the timeout.
  while (!timed_out) timed_out = !wait(&word, 0, deadline);
  // The kernel times out on the monotonic clock, absl::Now() reads the wall
  // clock: allow their drift over 50 ms (far below a millisecond).
  EXPECT_GE(absl::Now(), deadline - absl::Milliseconds(1));
  EXPECT_EQ(word.load(), 0u);
}

TEST_P(Futex, FarDeadlineStillWakes) {
  std::atomic<uint32_t> word{0};
  std::thread waker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    word.store(1, std::memory_order_seq_cst);
    wake(&word, 1);
  });
  const absl::Time far = absl::Now() + absl::Hours(24 * 365 * 100);
  while (word.load(std::memory_order_seq_cst) == 0) ASSERT_TRUE(wait(&word, 0, far));
  waker.join();
}

// Ping-pong: every round a store + wake races with the other thread's
// decision to sleep; one lost wake-up fails the bounded wait.
TEST_P(Futex, NoWakeUpIsLostInAPingPong) {
  constexpr uint32_t kRounds = 20000;
  std::atomic<uint32_t> turn{0};  // even: ping's turn, odd: pong's
  std::atomic<bool> lost{false};
  auto player = [&](uint32_t parity) {
    for (uint32_t round = parity; round < kRounds; round += 2) {
      uint32_t now = turn.load(std::memory_order_seq_cst);
      while (now != round) {
        if (!wait_until_changed(&turn, now)) {
          lost = true;
          return;
        }
        now = turn.load(std::memory_order_seq_cst);
      }
      turn.store(round + 1, std::memory_order_seq_cst);
      wake(&turn, 1);
    }
  };
  std::thread pong(player, 1u);
  player(0u);
  pong.join();
  EXPECT_FALSE(lost.load());
  EXPECT_EQ(turn.load(), kRounds);
}

TEST_P(Futex, WakeAllReleasesManyWaiters) {
  constexpr int kWaiters = 16;
  for (int trial = 0; trial < 20; ++trial) {
    std::atomic<uint32_t> word{0};
    std::atomic<int> released{0};
    std::atomic<int> lost{0};
    std::vector<std::thread> waiters;
    for (int i = 0; i < kWaiters; ++i) {
      waiters.emplace_back([&] {
        if (wait_until_changed(&word, 0)) {
          ++released;
        } else {
          ++lost;
        }
      });
    }
    word.store(1, std::memory_order_seq_cst);
    wake(&word, INT_MAX);
    for (auto& t : waiters) t.join();
    EXPECT_EQ(released.load(), kWaiters);
    EXPECT_EQ(lost.load(), 0);
  }
}

// Wake-ups of one at a time, each after a store: every waiter gets out.
TEST_P(Futex, WakeOneAtATimeReleasesEveryWaiter) {
  constexpr int kWaiters = 8;
  std::atomic<uint32_t> tickets{0};  // waiters take one each
  std::atomic<int> lost{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&] {
      const absl::Time deadline = absl::Now() + kHangGuard;
      while (true) {
        uint32_t t = tickets.load(std::memory_order_seq_cst);
        if (t > 0 && tickets.compare_exchange_weak(t, t - 1, std::memory_order_seq_cst)) return;
        if (t == 0 && !wait(&tickets, 0, deadline) && tickets.load() == 0) {
          ++lost;
          return;
        }
      }
    });
  }
  for (int i = 0; i < kWaiters; ++i) {
    tickets.fetch_add(1, std::memory_order_seq_cst);
    wake(&tickets, 1);
  }
  for (auto& t : waiters) t.join();
  EXPECT_EQ(lost.load(), 0);
  EXPECT_EQ(tickets.load(), 0u);
}

// The cross-process futex in one process, as the aarch64 stage runs it under
// qemu-user (where worker procs cannot start): two threads play ping-pong on
// one word of a shared-memory object, each through its own mapping of it (as
// two processes would), with futex_wait_shared/futex_wake_shared. A wake
// through one mapping must reach a sleeper on the other, and no wake-up may
// be lost on a weakly ordered CPU; the 30 s wait is only a hang guard.
TEST(FutexShared, PingPongThroughTwoMappingsOfOneObjectLosesNoWakeUp) {
  const std::string name = "/castmesh-futex-test-" + std::to_string(::getpid());
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ::shm_unlink(name.c_str());
  ASSERT_EQ(::ftruncate(fd, 4096), 0);
  void* first = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  void* second = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(first, MAP_FAILED);
  ASSERT_NE(second, MAP_FAILED);
  ASSERT_NE(first, second);
  auto* ping_word = new (first) std::atomic<uint32_t>(0);
  auto* pong_word = static_cast<std::atomic<uint32_t>*>(second);  // the same word, other mapping
  constexpr uint32_t kRounds = 20000;
  std::atomic<bool> lost{false};
  auto player = [&](std::atomic<uint32_t>* turn, uint32_t parity) {
    for (uint32_t round = parity; round < kRounds; round += 2) {
      uint32_t now = turn->load(std::memory_order_seq_cst);
      while (now != round) {
        const absl::Time guard = absl::Now() + kHangGuard;
        if (!futex_wait_shared(turn, now, guard) && turn->load(std::memory_order_seq_cst) == now &&
            absl::Now() >= guard) {
          lost = true;
          return;
        }
        now = turn->load(std::memory_order_seq_cst);
      }
      turn->store(round + 1, std::memory_order_seq_cst);
      futex_wake_shared(turn, 1);
    }
  };
  std::thread pong(player, pong_word, 1u);
  player(ping_word, 0u);
  pong.join();
  EXPECT_FALSE(lost.load()) << "a wake through one mapping did not reach the sleeper on the other";
  EXPECT_EQ(pong_word->load(), kRounds);
  ::munmap(first, 4096);
  ::munmap(second, 4096);
}

INSTANTIATE_TEST_SUITE_P(Implementations, Futex,
                         ::testing::Values(Impl{"futex", &futex_wait, &futex_wake},
                                           Impl{"parking_lot", &parking_lot_wait, &parking_lot_wake_void}),
                         [](const ::testing::TestParamInfo<Impl>& info) { return info.param.name; });

// --- parking lot specifics (it never returns spuriously, so these are exact) --

bool wait_for_parked(const void* word, size_t n) {
  const absl::Time deadline = absl::Now() + kHangGuard;
  while (parking_lot_parked(word) != n) {
    if (absl::Now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(ParkingLot, WakeCountsAreExactAndOldestFirst) {
  std::atomic<uint32_t> word{0};
  constexpr int kWaiters = 4;
  std::vector<std::thread> waiters;
  std::atomic<int> order{0};
  std::vector<int> woke_as(kWaiters, -1);
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      EXPECT_TRUE(parking_lot_wait(&word, 0, absl::Now() + kHangGuard));
      woke_as[i] = order.fetch_add(1);
    });
    ASSERT_TRUE(wait_for_parked(&word, static_cast<size_t>(i + 1)));  // park in order 0, 1, 2, 3
  }
  EXPECT_EQ(parking_lot_wake(&word, 1), 1);
  waiters[0].join();
  EXPECT_EQ(woke_as[0], 0);
  EXPECT_EQ(parking_lot_parked(&word), 3u);
  EXPECT_EQ(parking_lot_wake(&word, 2), 2);
  waiters[1].join();
  waiters[2].join();
  EXPECT_EQ(parking_lot_parked(&word), 1u);
  EXPECT_EQ(parking_lot_wake(&word, INT_MAX), 1);
  waiters[3].join();
  EXPECT_EQ(parking_lot_wake(&word, INT_MAX), 0);
}

// Words sharing buckets: a wake reaches only the threads parked on its word.
TEST(ParkingLot, WakeReachesOnlyItsOwnWord) {
  constexpr int kWords = 1024;  // more words than buckets: collisions for sure
  std::vector<std::atomic<uint32_t>> words(kWords);
  constexpr int kWatched = 32;
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWatched; ++i) {
    waiters.emplace_back([&, i] { EXPECT_TRUE(parking_lot_wait(&words[i * 31], 0, absl::Now() + kHangGuard)); });
  }
  for (int i = 0; i < kWatched; ++i) ASSERT_TRUE(wait_for_parked(&words[i * 31], 1));
  for (int i = 0; i < kWords; ++i) {
    const bool watched = i % 31 == 0 && i / 31 < kWatched;
    EXPECT_EQ(parking_lot_wake(&words[i], INT_MAX), watched ? 1 : 0) << i;
  }
  for (auto& t : waiters) t.join();
}

TEST(ParkingLot, TimedOutWaiterLeavesTheLot) {
  std::atomic<uint32_t> word{0};
  EXPECT_FALSE(parking_lot_wait(&word, 0, absl::Now() + absl::Milliseconds(10)));
  EXPECT_EQ(parking_lot_parked(&word), 0u);
  EXPECT_EQ(parking_lot_wake(&word, INT_MAX), 0);
}

}  // namespace
}  // namespace castmesh::detail
