// One-sided transfers on the links (core/link/transfers.h): a transfer goes
// along its routes (a link that refuses hands it on, the next one carries it
// and its path is what the result reports; none left is a clear error), it
// completes exactly once, and bytes reach a read's destination only while it
// is pending (no late bytes after a failure, nothing outside its range).
// The links here are fakes that only exercise this bookkeeping; the real
// RDMA links run across procs in tests/core/rdma and tests/python/test_rdma*.py.
#include "core/link/transfers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

namespace castmesh::link {
namespace {

// A fake link that refuses every transfer: it hands it on (Link's default start()).
class FakeRefusingLink final : public Link {
 public:
  Path path(const ProcId&) const override { return Path::kFake; }
  Capabilities capabilities() const override { return Capabilities{}; }
  std::atomic<int> started{0};
  void start(const std::shared_ptr<Transfer>& transfer) override {
    ++started;
    Link::start(transfer);
  }
};

// A fake link that carries a transfer by reporting `transport` and keeping
// it pending; the test delivers or fails it.
class FakeCarryingLink final : public Link {
 public:
  explicit FakeCarryingLink(RdmaTransport transport) : transport_(transport) {}
  Path path(const ProcId&) const override { return Path::kFake; }
  Capabilities capabilities() const override { return Capabilities{}; }
  void start(const std::shared_ptr<Transfer>& transfer) override {
    transfer->transport = transport_;
    carried = transfer;
  }
  std::shared_ptr<Transfer> carried;

 private:
  const RdmaTransport transport_;
};

struct Outcome {
  std::promise<absl::StatusOr<RdmaResult>> promise;
  std::atomic<int> calls{0};
};

// A tracked read of `destination` from proc "owner-proc" over `routes`.
std::shared_ptr<Transfer> tracked_read(std::vector<char>& destination, Routes routes,
                                       const std::shared_ptr<Outcome>& outcome,
                                       absl::Duration timeout = absl::Seconds(60)) {
  auto transfer = std::make_shared<Transfer>();
  transfer->id = Transfers::instance().next_id();
  transfer->remote.owner = "owner-proc";
  transfer->remote.id = 7;
  transfer->offset = 100;
  transfer->length = destination.size();
  transfer->bytes = destination.data();
  transfer->routes = std::move(routes);
  transfer->done = [outcome](absl::StatusOr<RdmaResult> result) {
    if (outcome->calls++ == 0) outcome->promise.set_value(std::move(result));
  };
  Transfers::instance().start(transfer, timeout);
  return transfer;
}

TEST(TransfersTest, NoRouteLeftIsAClearError) {
  std::vector<char> destination(8, 0);
  auto outcome = std::make_shared<Outcome>();
  auto transfer = tracked_read(destination, {}, outcome);
  start_next(transfer);
  absl::StatusOr<RdmaResult> result = outcome->promise.get_future().get();
  EXPECT_TRUE(absl::IsFailedPrecondition(result.status())) << result.status();
  EXPECT_NE(result.status().message().find("owner-proc"), std::string::npos) << result.status();
  EXPECT_EQ(Transfers::instance().find(transfer->id), nullptr);
}

TEST(TransfersTest, ARefusingLinkHandsOnAndTheCarrierReportsItsPath) {
  std::vector<char> destination(6, 0);
  auto outcome = std::make_shared<Outcome>();
  FakeRefusingLink refusing;
  FakeCarryingLink carrying(RdmaTransport::kSharedSegment);
  auto transfer = tracked_read(destination, {&refusing, &carrying}, outcome);
  start_next(transfer);
  EXPECT_EQ(refusing.started.load(), 1);
  ASSERT_EQ(carrying.carried, transfer);
  EXPECT_TRUE(transfer->routes.empty());
  // Two chunks, out of order: complete once every byte is there.
  Transfers::instance().deliver(transfer, 103, "def", 3);
  EXPECT_EQ(Transfers::instance().find(transfer->id), transfer);
  Transfers::instance().deliver(transfer, 100, "abc", 3);
  absl::StatusOr<RdmaResult> result = outcome->promise.get_future().get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->bytes, 6u);
  EXPECT_EQ(result->transport, RdmaTransport::kSharedSegment);
  EXPECT_EQ(std::string(destination.data(), 6), "abcdef");
  EXPECT_EQ(outcome->calls.load(), 1);
}

TEST(TransfersTest, NoBytesLandAfterTheTransferFailed) {
  std::vector<char> destination(4, 'x');
  auto outcome = std::make_shared<Outcome>();
  FakeCarryingLink carrying(RdmaTransport::kSocket);
  auto transfer = tracked_read(destination, {&carrying}, outcome);
  start_next(transfer);
  Transfers::instance().finish(transfer, absl::AbortedError("the test failed it"));
  // A late chunk and a late copy: neither touches the destination.
  Transfers::instance().deliver(transfer, 100, "late", 4);
  absl::Status copied;
  EXPECT_FALSE(Transfers::instance().copy_if_live(
      transfer,
      [&] {
        std::memcpy(destination.data(), "LATE", 4);
        return absl::OkStatus();
      },
      &copied));
  EXPECT_EQ(std::string(destination.data(), 4), "xxxx");
  absl::StatusOr<RdmaResult> result = outcome->promise.get_future().get();
  EXPECT_TRUE(absl::IsAborted(result.status())) << result.status();
  EXPECT_EQ(outcome->calls.load(), 1);
}

TEST(TransfersTest, BytesOutsideTheReadFailIt) {
  std::vector<char> destination(4, 'x');
  auto outcome = std::make_shared<Outcome>();
  FakeCarryingLink carrying(RdmaTransport::kSocket);
  auto transfer = tracked_read(destination, {&carrying}, outcome);
  start_next(transfer);
  Transfers::instance().deliver(transfer, 102, "abcd", 4);  // [102, 106) past [100, 104)
  absl::StatusOr<RdmaResult> result = outcome->promise.get_future().get();
  EXPECT_TRUE(absl::IsInternal(result.status())) << result.status();
  EXPECT_EQ(std::string(destination.data(), 4), "xxxx");
}

TEST(TransfersTest, TheOwnersLossFailsOnlyItsTransfers) {
  std::vector<char> first(2, 0), second(2, 0);
  auto lost_outcome = std::make_shared<Outcome>();
  auto kept_outcome = std::make_shared<Outcome>();
  FakeCarryingLink carrying(RdmaTransport::kSocket);
  auto lost = tracked_read(first, {&carrying}, lost_outcome);
  start_next(lost);
  auto kept = tracked_read(second, {&carrying}, kept_outcome);
  kept->remote.owner = "another-proc";
  start_next(kept);
  Transfers::instance().owner_lost("owner-proc", absl::UnavailableError("its connection closed"));
  absl::StatusOr<RdmaResult> result = lost_outcome->promise.get_future().get();
  EXPECT_TRUE(absl::IsUnavailable(result.status())) << result.status();
  EXPECT_EQ(Transfers::instance().find(kept->id), kept);
  Transfers::instance().finish(kept, RdmaResult{0, RdmaTransport::kSocket});
  EXPECT_TRUE(kept_outcome->promise.get_future().get().ok());
}

TEST(TransfersTest, ATransferThatNeverCompletesTimesOut) {
  std::vector<char> destination(2, 0);
  auto outcome = std::make_shared<Outcome>();
  FakeCarryingLink carrying(RdmaTransport::kSocket);
  auto transfer = tracked_read(destination, {&carrying}, outcome, absl::Milliseconds(20));
  start_next(transfer);
  absl::StatusOr<RdmaResult> result = outcome->promise.get_future().get();
  EXPECT_TRUE(absl::IsDeadlineExceeded(result.status())) << result.status();
  EXPECT_NE(result.status().message().find("owner-proc"), std::string::npos) << result.status();
}

}  // namespace
}  // namespace castmesh::link
