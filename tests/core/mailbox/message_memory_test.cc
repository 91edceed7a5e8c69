// Message memory (the per-thread pool behind envelopes and future states):
// blocks allocated on one thread and freed on another come back intact and
// are never handed out twice while live; threads that exit give their
// blocks back. The pool is compiled out under ASan/TSan (plain new/delete),
// so these tests exercise it in the dev and release builds.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "castmesh/detail/envelope.h"

namespace castmesh::detail {
namespace {

struct Block {
  void* p;
  std::size_t size;
  uint8_t fill;
};

void write_pattern(const Block& b) { std::memset(b.p, b.fill, b.size); }
bool pattern_intact(const Block& b) {
  const auto* bytes = static_cast<const uint8_t*>(b.p);
  for (std::size_t i = 0; i < b.size; ++i) {
    if (bytes[i] != b.fill) return false;
  }
  return true;
}

TEST(MessageMemory, LiveBlocksAreDistinctAndKeepTheirBytes) {
  // Every size class and one size above them (plain operator new).
  const std::size_t sizes[] = {8, 64, 65, 128, 200, 256, 512, 513, 4096};
  std::vector<Block> live;
  std::set<uintptr_t> addresses;
  for (int round = 0; round < 600; ++round) {
    for (std::size_t size : sizes) {
      Block b{allocate_message_memory(size), size, static_cast<uint8_t>(live.size() * 7 + 1)};
      ASSERT_NE(b.p, nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.p) % alignof(std::max_align_t), 0u);
      EXPECT_TRUE(addresses.insert(reinterpret_cast<uintptr_t>(b.p)).second) << "block handed out twice";
      write_pattern(b);
      live.push_back(b);
    }
  }
  for (const Block& b : live) EXPECT_TRUE(pattern_intact(b));
  for (const Block& b : live) free_message_memory(b.p, b.size);
}

TEST(MessageMemory, FreedOnAnotherThreadAndReused) {
  // A producer allocates, a consumer frees (the mailbox pattern), in rounds
  // large enough to move batches through the shared depot both ways.
  constexpr int kRounds = 20;
  constexpr int kPerRound = 5000;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<Block> blocks;
    std::thread producer([&] {
      for (int i = 0; i < kPerRound; ++i) {
        const std::size_t size = (i % 3 == 0) ? 100 : 48;
        Block b{allocate_message_memory(size), size, static_cast<uint8_t>(i)};
        write_pattern(b);
        blocks.push_back(b);
      }
    });
    producer.join();
    std::set<uintptr_t> addresses;
    for (const Block& b : blocks) {
      EXPECT_TRUE(addresses.insert(reinterpret_cast<uintptr_t>(b.p)).second) << "block handed out twice";
    }
    std::thread consumer([&] {
      for (const Block& b : blocks) {
        EXPECT_TRUE(pattern_intact(b));
        free_message_memory(b.p, b.size);
      }
    });
    consumer.join();  // the exiting threads' cached blocks go back to the depot
  }
}

TEST(MessageMemory, ConcurrentProducersAndConsumers) {
  constexpr int kPairs = 2;
  constexpr int kPerPair = 20000;
  std::vector<std::thread> threads;
  std::vector<std::vector<Block>> handed(kPairs);
  std::vector<std::atomic<int>> ready(kPairs);
  for (int p = 0; p < kPairs; ++p) {
    handed[p].resize(kPerPair);
    threads.emplace_back([&, p] {
      for (int i = 0; i < kPerPair; ++i) {
        Block b{allocate_message_memory(64), 64, static_cast<uint8_t>(i + p)};
        write_pattern(b);
        handed[p][i] = b;
        ready[p].store(i + 1, std::memory_order_release);
      }
    });
    threads.emplace_back([&, p] {
      for (int i = 0; i < kPerPair; ++i) {
        while (ready[p].load(std::memory_order_acquire) <= i) std::this_thread::yield();
        EXPECT_TRUE(pattern_intact(handed[p][i]));
        free_message_memory(handed[p][i].p, 64);
      }
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace castmesh::detail
