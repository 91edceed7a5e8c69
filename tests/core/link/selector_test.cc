// The selector (core/link/selector.h): the cost table's rule (choose) for
// every placement, size edge and set of available paths, and Selector's
// routes: ranks of this process, a test link's override.
#include "core/link/selector.h"

#include <gtest/gtest.h>

#include <iterator>
#include <memory>
#include <optional>

#include "core/link/fake_link.h"

namespace castmesh::link {
namespace {

constexpr size_t kBig = kSingleCopyMinBytes;
constexpr size_t kSmall = kSingleCopyMinBytes - 1;

TEST(ChooseTest, SameProcessIsAlwaysInProcess) {
  const Available all{Path::kInProcess, Path::kSingleCopy, Path::kShmRing, Path::kSocket, Path::kIbverbs};
  for (size_t bytes : {size_t{0}, kSmall, kBig, size_t{1} << 30}) {
    EXPECT_EQ(choose(Placement::kSameProcess, bytes, all), Path::kInProcess) << bytes;
  }
}

TEST(ChooseTest, SameHostTakesSingleCopyFromItsThreshold) {
  const Available collectives{Path::kInProcess, Path::kSingleCopy, Path::kShmRing, Path::kSocket};
  EXPECT_EQ(choose(Placement::kSameHost, 0, collectives), Path::kShmRing);
  EXPECT_EQ(choose(Placement::kSameHost, kSmall, collectives), Path::kShmRing);
  EXPECT_EQ(choose(Placement::kSameHost, kBig, collectives), Path::kSingleCopy);
}

TEST(ChooseTest, SameHostWithoutSingleCopy) {
  // RDMA where the kernel refuses cross-memory copies: the shared segment.
  EXPECT_EQ(choose(Placement::kSameHost, kBig, Available{Path::kSharedSegment, Path::kSocket}),
            Path::kSharedSegment);
  EXPECT_EQ(choose(Placement::kSameHost, kSmall, Available{Path::kSharedSegment, Path::kSocket}), Path::kSocket);
  // Collectives with CASTMESH_SINGLE_COPY=0: the ring at every size.
  EXPECT_EQ(choose(Placement::kSameHost, kBig, Available{Path::kShmRing, Path::kSocket}), Path::kShmRing);
  // Neither ring nor single copy (CASTMESH_SHM=0 too): the socket.
  EXPECT_EQ(choose(Placement::kSameHost, kBig, Available{Path::kSocket}), Path::kSocket);
}

TEST(ChooseTest, OtherHost) {
  const Available all{Path::kInProcess, Path::kSingleCopy, Path::kShmRing, Path::kSocket};
  EXPECT_EQ(choose(Placement::kOtherHost, kBig, all), Path::kSocket);
  EXPECT_EQ(choose(Placement::kOtherHost, 0, all), Path::kSocket);
  Available nic = all;
  nic.add(Path::kIbverbs);
  EXPECT_EQ(choose(Placement::kOtherHost, 0, nic), Path::kIbverbs);
  // A reachable NIC wins on the same host too (as RDMA buffers choose).
  EXPECT_EQ(choose(Placement::kSameHost, kBig, nic), Path::kIbverbs);
}

TEST(ChooseInOrderTest, ListsEveryApplicableRowInTheTablesOrder) {
  Path out[std::size(kCostTable)];
  // RDMA on this host, large, everything offered: single copy, then the
  // segment where the kernel refuses it, then the socket.
  const Available rdma{Path::kSingleCopy, Path::kSharedSegment, Path::kSocket};
  ASSERT_EQ(choose_in_order(Placement::kSameHost, kBig, rdma, out), 3u);
  EXPECT_EQ(out[0], Path::kSingleCopy);
  EXPECT_EQ(out[1], Path::kSharedSegment);
  EXPECT_EQ(out[2], Path::kSocket);
  // Small: only the socket row applies.
  ASSERT_EQ(choose_in_order(Placement::kSameHost, kSmall, rdma, out), 1u);
  EXPECT_EQ(out[0], Path::kSocket);
  // Another host: the same-host rows never apply.
  ASSERT_EQ(choose_in_order(Placement::kOtherHost, kBig, rdma, out), 1u);
  EXPECT_EQ(out[0], Path::kSocket);
  // The first entry is always choose()'s.
  for (size_t bytes : {size_t{0}, kSmall, kBig}) {
    const Available all{Path::kInProcess, Path::kSingleCopy, Path::kShmRing, Path::kSocket, Path::kIbverbs};
    for (Placement where : {Placement::kSameProcess, Placement::kSameHost, Placement::kOtherHost}) {
      ASSERT_GE(choose_in_order(where, bytes, all, out), 1u);
      EXPECT_EQ(out[0], choose(where, bytes, all));
    }
  }
  EXPECT_EQ(choose_in_order(Placement::kOtherHost, 1, Available{}, out), 0u);
}

TEST(ChooseTest, NothingAvailable) {
  EXPECT_EQ(choose(Placement::kOtherHost, 1, Available{}), std::nullopt);
  EXPECT_EQ(choose(Placement::kOtherHost, 1, Available{Path::kInProcess, Path::kShmRing}), std::nullopt);
  EXPECT_EQ(choose(Placement::kSameProcess, 1, Available{Path::kSocket}), std::nullopt);
}

TEST(PathNameTest, EveryPathHasAName) {
  for (Path p : {Path::kInProcess, Path::kShmRing, Path::kSingleCopy, Path::kSocket, Path::kSharedSegment,
                 Path::kIbverbs, Path::kDeviceStaging, Path::kFake}) {
    EXPECT_NE(path_name(p), "unknown");
  }
  EXPECT_EQ(path_name(Path::kSingleCopy), "single_copy");  // what RDMA results report too
}

TEST(SelectorTest, RanksOfThisProcessGoInProcess) {
  Selector selector({"me", "me"}, "me", {}, "test communicator");
  for (size_t bytes : {size_t{0}, kBig, size_t{64} << 20}) {
    Route route = selector.route(1, bytes);
    EXPECT_EQ(route.link, &InProcessLink::instance());
    EXPECT_FALSE(route.caps.send_holds_buffer);
    EXPECT_EQ(selector.path(1, bytes), Path::kInProcess);
  }
  EXPECT_EQ(selector.placement(0), Placement::kSameProcess);
}

TEST(SelectorTest, AnOverrideCarriesEveryOtherRank) {
  auto fake = std::make_shared<testing::FakeLink>(testing::FakeLink::Options{});
  Selector selector({"me", "fake-peer"}, "me", {}, "test communicator", fake);
  EXPECT_EQ(selector.route(1, 8).link, fake.get());
  EXPECT_EQ(selector.path(1, kBig), Path::kFake);
  EXPECT_EQ(selector.route(0, 8).link, &InProcessLink::instance());  // this process: never the override
}

TEST(SelectorTest, APeerElsewhereGoesAsFrames) {
  // A TCP address on a documentation network: not this host.
  Selector selector({"me", "tcp:198.18.0.77:4000"}, "me", {}, "test communicator");
  EXPECT_EQ(selector.placement(1), Placement::kOtherHost);
  for (size_t bytes : {size_t{8}, kBig}) {
    Route route = selector.route(1, bytes);
    EXPECT_TRUE(route.caps.send_holds_buffer);
    EXPECT_FALSE(route.caps.send_waits_for_receive);
    EXPECT_EQ(selector.path(1, bytes), Path::kSocket);
  }
}

}  // namespace
}  // namespace castmesh::link
