// ScratchPool: a communicator's pipelined-collective memory, reused between
// calls, never shared by two calls at once, and bounded when idle.
#include "core/collectives/scratch_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

namespace castmesh::collectives {
namespace {

TEST(ScratchPool, ALaterCallGetsTheSameMemoryBack) {
  ScratchPool pool;
  char* first = nullptr;
  {
    ScratchPool::Lease lease = pool.take(1 << 20);
    first = lease.data();
    std::memset(first, 7, 1 << 20);  // all of it is this caller's
  }
  ScratchPool::Lease again = pool.take(1 << 10);  // smaller: the kept one fits
  EXPECT_EQ(again.data(), first);
}

TEST(ScratchPool, ConcurrentLeasesNeverShareMemory) {
  ScratchPool pool;
  ScratchPool::Lease a = pool.take(4096);
  ScratchPool::Lease b = pool.take(4096);
  EXPECT_NE(a.data(), b.data());
}

TEST(ScratchPool, TheSmallestBufferThatFitsIsTaken) {
  ScratchPool pool;
  char* big = nullptr;
  char* small = nullptr;
  {
    ScratchPool::Lease a = pool.take(1 << 20);
    ScratchPool::Lease b = pool.take(1 << 12);
    big = a.data();
    small = b.data();
  }
  ScratchPool::Lease fits_small = pool.take(1 << 11);
  ScratchPool::Lease needs_big = pool.take(1 << 16);
  EXPECT_EQ(fits_small.data(), small);
  EXPECT_EQ(needs_big.data(), big);
}

TEST(ScratchPool, AtMostTwoIdleBuffersAreKeptTheLargest) {
  ScratchPool pool;
  std::set<char*> two_largest;
  {
    ScratchPool::Lease a = pool.take(1 << 10);
    ScratchPool::Lease b = pool.take(1 << 20);
    ScratchPool::Lease c = pool.take(1 << 16);
    two_largest = {b.data(), c.data()};
  }
  // Three came back and the 1 KiB one was freed: two 1 KiB leases now get
  // the 64 KiB and the 1 MiB buffers.
  ScratchPool::Lease x = pool.take(1 << 10);
  ScratchPool::Lease y = pool.take(1 << 10);
  EXPECT_EQ((std::set<char*>{x.data(), y.data()}), two_largest);
}

TEST(ScratchPool, ThreadsTakingAndReturningKeepTheirBytes) {
  ScratchPool pool;
  std::vector<std::thread> threads;
  std::atomic<int> corrupted{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const size_t bytes = 64 + static_cast<size_t>((i * 7 + t) % 4096);
        ScratchPool::Lease lease = pool.take(bytes);
        std::memset(lease.data(), t, bytes);
        for (size_t k = 0; k < bytes; k += 61) {
          if (lease.data()[k] != static_cast<char>(t)) corrupted.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(corrupted.load(), 0);
}

}  // namespace
}  // namespace castmesh::collectives
