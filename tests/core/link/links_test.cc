// Each real link on its own (core/link/): the in-process link's sends and
// aborts into a rank's mailbox; the frame link and single-copy link without
// a transport (the failure is an error, never a crash, and no offer stays
// pending); the single-copy link's one-sided reads and writes into a
// registered region of a live process, its bounds, another host's region,
// and a process that is gone.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/collectives/exchange.h"
#include "core/link/frame_link.h"
#include "core/link/in_process_link.h"
#include "core/link/single_copy.h"
#include "core/link/single_copy_link.h"

namespace castmesh::link {
namespace {

using collectives::Channel;
using collectives::Exchange;
using collectives::PostedRecv;

Envelope envelope(std::string_view comm, int source, int dest, int64_t tag) {
  return Envelope{comm, source, dest, /*collective=*/false, tag, 0, {}};
}

TEST(InProcessLinkTest, SendLandsInThePostedReceive) {
  const std::string comm = "links-test-in-process";
  std::vector<char> landing(100, 0);
  auto request = std::make_shared<detail::RequestState>();
  Exchange::instance().mailbox(comm, 1)->post(
      PostedRecv{Channel::kP2P, 0, 5, nullptr, landing.data(), landing.size(), request});
  const std::string payload = "over the in-process link";
  InProcessLink& link = InProcessLink::instance();
  EXPECT_EQ(link.path("anyone"), Path::kInProcess);
  std::optional<absl::Status> sent = link.send_now("me", envelope(comm, 0, 1, 5), payload.data(), payload.size());
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(sent->ok()) << *sent;
  ASSERT_TRUE(request->done());  // delivered before send_now returned
  EXPECT_EQ(request->result()->bytes, payload.size());
  EXPECT_EQ(std::string(landing.data(), payload.size()), payload);
  Exchange::instance().forget(comm, 1);
}

TEST(InProcessLinkTest, AbortFailsTheCollectivesReceives) {
  const std::string comm = "links-test-abort";
  constexpr uint64_t kSequence = 9;
  char landing[8];
  auto request = std::make_shared<detail::RequestState>();
  auto signature = std::make_shared<const std::string>("allreduce");
  Exchange::instance().mailbox(comm, 1)->post(PostedRecv{Channel::kCollective, 0,
                                                         collectives::collective_tag(kSequence, 0), signature,
                                                         landing, sizeof(landing), request});
  Envelope e{comm, 0, 1, true, 0, kSequence, {}};
  ASSERT_TRUE(InProcessLink::instance().send_abort("me", e, absl::AbortedError("rank 0: it broke")).ok());
  ASSERT_TRUE(request->done());
  EXPECT_TRUE(absl::IsAborted(request->result().status())) << request->result().status();
  Exchange::instance().forget(comm, 1);
}

TEST(FrameLinkTest, WithoutATransportSendsFailCleanly) {
  FrameLink link{std::weak_ptr<proc::ProcHost>()};
  const std::string small(100, 'a'), large(kInPlaceMinBytes, 'b');
  EXPECT_EQ(link.path("unix:/nowhere"), Path::kSocket);
  std::optional<absl::Status> sent = link.send_now("unix:/nowhere", envelope("c", 0, 1, 1), small.data(), small.size());
  ASSERT_TRUE(sent.has_value());
  EXPECT_TRUE(absl::IsUnavailable(*sent)) << *sent;
  // Large bodies are not sent at once (they leave from the buffer)...
  EXPECT_FALSE(link.send_now("unix:/nowhere", envelope("c", 0, 1, 1), large.data(), large.size()).has_value());
  // ...and their request carries the failure.
  auto request = link.post_send("unix:/nowhere", envelope("c", 0, 1, 1), large.data(), large.size());
  ASSERT_TRUE(request->done());
  EXPECT_TRUE(absl::IsUnavailable(request->result().status()));
  EXPECT_TRUE(link.capabilities().send_holds_buffer);
  EXPECT_FALSE(link.capabilities().one_sided);
}

TEST(SingleCopyLinkTest, AnOfferThatCannotGoFailsAndIsForgotten) {
  FrameLink frames{std::weak_ptr<proc::ProcHost>()};
  SingleCopyLink link(frames, "test communicator");
  const std::string body(kSingleCopyMinBytes, 'c');
  auto request = link.post_send("unix:/nowhere", envelope("c", 0, 1, 1), body.data(), body.size());
  ASSERT_TRUE(request->done());
  EXPECT_TRUE(absl::IsUnavailable(request->result().status()));
  link.on_answer(1, false);  // an answer to no pending offer is ignored
  link.peer_lost("unix:/nowhere", absl::UnavailableError("gone"));
  link.abandon_send(request);  // complete already: returns at once
  const Capabilities caps = link.capabilities();
  EXPECT_TRUE(caps.one_sided && caps.zero_copy && caps.send_holds_buffer && caps.send_waits_for_receive);
}

class SingleCopyOneSidedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // process_vm_readv on this process itself: refused only where the
    // kernel or a sandbox forbids cross-memory attach altogether.
    char probe = 0, source = 1;
    absl::Status st = copy_between(::getpid(), reinterpret_cast<uint64_t>(&source), &probe, 1, false);
    if (absl::IsPermissionDenied(st) || absl::IsUnimplemented(st)) {
      GTEST_SKIP() << "cross-memory copies are refused here (" << st << "): single copy cannot run";
    }
  }
  FrameLink frames_{std::weak_ptr<proc::ProcHost>()};
  SingleCopyLink link_{frames_, "test communicator"};
};

TEST_F(SingleCopyOneSidedTest, ReadsAndWritesARegisteredRegion) {
  std::vector<char> owner(1 << 20);
  for (size_t i = 0; i < owner.size(); ++i) owner[i] = static_cast<char>(i * 7);
  const Region region = local_region(owner.data(), owner.size());
  std::vector<char> out(4096);
  ASSERT_TRUE(link_.read(region, 1000, out.data(), out.size()).ok());
  EXPECT_EQ(0, std::memcmp(out.data(), owner.data() + 1000, out.size()));
  const std::string in(5000, 'w');
  ASSERT_TRUE(link_.write(region, owner.size() - in.size(), in.data(), in.size()).ok());
  EXPECT_EQ(std::string(owner.end() - static_cast<long>(in.size()), owner.end()), in);
}

TEST_F(SingleCopyOneSidedTest, RefusesWhatLiesOutsideTheRegion) {
  std::vector<char> owner(100);
  const Region region = local_region(owner.data(), owner.size());
  char out[16];
  EXPECT_TRUE(absl::IsOutOfRange(link_.read(region, 90, out, sizeof(out))));
  EXPECT_TRUE(absl::IsOutOfRange(link_.write(region, ~uint64_t{0}, out, 1)));
  Region elsewhere = region;
  elsewhere.host_identity = "another-host";
  EXPECT_TRUE(absl::IsFailedPrecondition(link_.read(elsewhere, 0, out, 1)));
}

TEST_F(SingleCopyOneSidedTest, AGoneOwnerIsUnavailable) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  std::vector<char> owner(64);
  Region region = local_region(owner.data(), owner.size());
  region.pid = child;  // reaped: no such process now
  char out[64];
  EXPECT_TRUE(absl::IsUnavailable(link_.read(region, 0, out, sizeof(out))));
}

}  // namespace
}  // namespace castmesh::link
