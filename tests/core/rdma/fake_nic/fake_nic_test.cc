// FakeNic.*: RdmaBuffer's ibverbs transport between real worker procs (this
// binary re-executed) through the FAKE rdma plugin of this folder (the
// backend's logic over a fake verbs provider that moves bytes between
// processes; CTest puts it on CASTMESH_BACKEND_PATH). With a real NIC the
// same code runs with the real plugin.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "castmesh/castmesh.h"
#include "castmesh/proc_mesh.h"
#include "castmesh/rdma.h"
#include "rdma_test_bytes.h"  // tests/core/rdma/
#include "rdma_test_procs.h"

namespace {

using castmesh::DType;
using castmesh::RdmaAccess;
using castmesh::RdmaBuffer;
using castmesh::RdmaOptions;
using castmesh::RdmaTransport;
using castmesh::TensorView;

using castmesh::rdma_test::filled;
using castmesh::rdma_test::mismatch;
using castmesh::rdma_test::pattern;

}  // namespace

using castmesh::rdma_test::Numbers;
CASTMESH_REGISTER_MESSAGE(Numbers, "castmesh.test.fake_nic.Numbers", castmesh::rdma_test::encode_numbers,
                          castmesh::rdma_test::decode_numbers);

namespace {

// {size} -> registers memory filled with pattern(seed 1); {seed, offset, length} -> "" when the
// owner's bytes [offset, offset+length) are pattern(0.., seed), else the first difference.
class FakeNicOwner : public castmesh::Actor {
 public:
  absl::StatusOr<RdmaBuffer> make(const Numbers& m) {
    if (m.values.size() == 1) {
      memory_ = filled(static_cast<size_t>(m.values.at(0)), 1);
      return RdmaBuffer::register_memory(memory_, RdmaAccess::kReadWrite);
    }
    return absl::InvalidArgumentError(mismatch(static_cast<char*>(memory_.data()) + m.values.at(1), 0,
                                               static_cast<size_t>(m.values.at(2)), static_cast<int>(m.values[0])));
  }
  using Handlers = castmesh::Handlers<&FakeNicOwner::make>;

 private:
  TensorView memory_;
};

}  // namespace

CASTMESH_REGISTER_ACTOR(FakeNicOwner);

namespace {

using castmesh::rdma_test::ScopedEnv;

// Two owner procs with the fake NIC (owners_[0], owners_[1]) and one whose
// NIC cannot be opened (owners_[2]).
class FakeNic : public ::testing::Test {
 protected:
  void SetUp() override {
    auto procs = castmesh::LocalAllocator().allocate(runtime_, 2);
    ASSERT_TRUE(procs.ok()) << procs.status();
    nic_procs_ = *procs;
    {
      ScopedEnv no_nic("CASTMESH_RDMA_DEVICE", "fake_nic_absent");  // inherited by the worker only
      auto plain = castmesh::LocalAllocator().allocate(runtime_, 1);
      ASSERT_TRUE(plain.ok()) << plain.status();
      plain_procs_ = *plain;
    }
    auto owners = nic_procs_.spawn<FakeNicOwner>("owner");
    ASSERT_TRUE(owners.ok()) << owners.status();
    auto plain_owner = plain_procs_.spawn<FakeNicOwner>("owner");
    ASSERT_TRUE(plain_owner.ok()) << plain_owner.status();
    owners_ = {owners->at(0), owners->at(1), plain_owner->at(0)};
  }
  void TearDown() override {
    (void)nic_procs_.stop();
    (void)plain_procs_.stop();
  }

  RdmaBuffer make(size_t owner, size_t size) {
    auto made = owners_.at(owner).ask(Numbers{{static_cast<int64_t>(size)}}).get(absl::Seconds(30));
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? *made : RdmaBuffer();
  }
  std::string verify(size_t owner, int seed, size_t offset, size_t length) {
    auto answer = owners_.at(owner)
                      .ask(Numbers{{seed, static_cast<int64_t>(offset), static_cast<int64_t>(length)}})
                      .get(absl::Seconds(30));
    return std::string(answer.status().message());
  }

  castmesh::Runtime runtime_;
  castmesh::ProcMesh nic_procs_;
  castmesh::ProcMesh plain_procs_;
  std::vector<castmesh::ActorRef<FakeNicOwner>> owners_;
};

TEST_F(FakeNic, ReadsAndWritesOfSeveralSizesUseIbverbs) {
  for (size_t size : {size_t{1}, size_t{4095}, size_t{300000}, (size_t{64} << 20) + 3}) {
    SCOPED_TRACE(absl::StrCat("size ", size));
    RdmaBuffer buffer = make(0, size);
    ASSERT_TRUE(buffer.valid());
    ASSERT_FALSE(buffer.transports().empty());
    EXPECT_EQ(buffer.transports().front(), RdmaTransport::kIbverbs);
    TensorView dst = TensorView::Allocate(DType::kUInt8, {static_cast<int64_t>(size)});
    auto read = buffer.read_into(dst).get(absl::Seconds(60));
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->bytes, size);
    EXPECT_EQ(read->transport, RdmaTransport::kIbverbs);
    ASSERT_EQ(mismatch(dst.data(), 0, size, 1), "");
    TensorView src = filled(size, 2);
    auto wrote = buffer.write_from(src).get(absl::Seconds(60));
    ASSERT_TRUE(wrote.ok()) << wrote.status();
    EXPECT_EQ(wrote->transport, RdmaTransport::kIbverbs);
    EXPECT_EQ(verify(0, 2, 0, size), "");
    ASSERT_TRUE(buffer.release().get(absl::Seconds(30)).ok());
  }
}

TEST_F(FakeNic, OffsetsAndBorrowedMemoryOnTwoOwners) {
  RdmaBuffer a = make(0, 200000), b = make(1, 100000);
  std::vector<uint8_t> borrowed(150000);
  TensorView dst = TensorView::Contiguous(borrowed.data(), DType::kUInt8, {150000});
  auto read = a.read_into(dst, RdmaOptions{.offset = 12345, .length = 100001}).get(absl::Seconds(30));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->transport, RdmaTransport::kIbverbs);
  EXPECT_EQ(mismatch(dst.data(), 12345, 100001, 1), "");
  std::vector<uint8_t> source(70001);
  for (size_t i = 0; i < source.size(); ++i) source[i] = pattern(i, 5);
  TensorView src = TensorView::Contiguous(source.data(), DType::kUInt8, {70001});
  auto wrote = b.write_from(src, RdmaOptions{.offset = 29999}).get(absl::Seconds(30));
  ASSERT_TRUE(wrote.ok()) << wrote.status();
  EXPECT_EQ(wrote->transport, RdmaTransport::kIbverbs);
  EXPECT_EQ(verify(1, 5, 29999, 70001), "");
  auto empty = a.read_into(dst, RdmaOptions{.offset = 200000, .length = 0}).get(absl::Seconds(30));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->bytes, 0u);
  EXPECT_EQ(empty->transport, RdmaTransport::kIbverbs);
}

TEST_F(FakeNic, MoreOperationsThanTheSendQueueHoldsAllComplete) {
  constexpr size_t kPart = 1000;
  constexpr size_t kOps = 400;  // the send queue holds 128: the rest wait for completions
  RdmaBuffer buffer = make(0, kOps * kPart);
  std::vector<TensorView> parts;
  std::vector<castmesh::Future<castmesh::RdmaResult>> pending;
  for (size_t i = 0; i < kOps; ++i) {
    if (i % 2 == 0) {
      parts.push_back(TensorView::Allocate(DType::kUInt8, {static_cast<int64_t>(kPart)}));
      pending.push_back(buffer.read_into(parts.back(), RdmaOptions{.offset = i * kPart}));
    } else {
      parts.push_back(filled(kPart, static_cast<int>(i % 7 + 3)));
      pending.push_back(buffer.write_from(parts.back(), RdmaOptions{.offset = i * kPart}));
    }
  }
  for (size_t i = 0; i < kOps; ++i) {
    auto done = pending[i].get(absl::Seconds(60));
    ASSERT_TRUE(done.ok()) << "op " << i << ": " << done.status();
    EXPECT_EQ(done->transport, RdmaTransport::kIbverbs);
    if (i % 2 == 0) {
      ASSERT_EQ(mismatch(parts[i].data(), i * kPart, kPart, 1), "") << "op " << i;
    }
  }
  for (size_t i = 1; i < kOps; i += 2) {
    ASSERT_EQ(verify(0, static_cast<int>(i % 7 + 3), i * kPart, kPart), "") << "op " << i;
  }
}

TEST_F(FakeNic, OwnerWithoutANicFallsBack) {
  RdmaBuffer buffer = make(2, 100000);
  for (RdmaTransport t : buffer.transports()) EXPECT_NE(t, RdmaTransport::kIbverbs);
  TensorView dst = TensorView::Allocate(DType::kUInt8, {100000});
  auto read = buffer.read_into(dst).get(absl::Seconds(30));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_NE(read->transport, RdmaTransport::kIbverbs);
  EXPECT_EQ(mismatch(dst.data(), 0, 100000, 1), "");
}

TEST_F(FakeNic, ForbiddenFallbackSucceedsWithTheNicAndFailsWithout) {
  RdmaBuffer nic = make(0, 1000), plain = make(2, 1000);
  ScopedEnv forbid("CASTMESH_RDMA_FALLBACK", "error");
  TensorView dst = TensorView::Allocate(DType::kUInt8, {1000});
  auto read = nic.read_into(dst).get(absl::Seconds(30));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->transport, RdmaTransport::kIbverbs);
  auto refused = plain.read_into(dst).get(absl::Seconds(30));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("CASTMESH_RDMA_FALLBACK"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("without an RDMA NIC"), std::string::npos) << refused.status();
}

TEST_F(FakeNic, FailedConnectFailsTheOperationThenFallsBack) {
  RdmaBuffer plain = make(2, 100000);
  // The plain owner's handle as if its owner had a NIC: transports += [ibverbs]
  // (field 7), nic_address (field 8) and rkey (field 9).
  std::string bytes = plain.serialize() + std::string("\x38\x01\x40\x80\x20\x48\x01", 7);
  auto forged = RdmaBuffer::deserialize(bytes);
  ASSERT_TRUE(forged.ok()) << forged.status();
  TensorView dst = TensorView::Allocate(DType::kUInt8, {100000});
  auto failed = forged->read_into(dst).get(absl::Seconds(30));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_NE(failed.status().message().find("ibverbs connection"), std::string::npos) << failed.status();
  auto fallback = forged->read_into(dst).get(absl::Seconds(30));
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_NE(fallback->transport, RdmaTransport::kIbverbs);
  EXPECT_EQ(mismatch(dst.data(), 0, 100000, 1), "");
}

TEST_F(FakeNic, ReleaseThenUseFailsAndTheConnectionRecovers) {
  RdmaBuffer buffer = make(0, 50000), other = make(0, 50000);
  TensorView dst = TensorView::Allocate(DType::kUInt8, {50000});
  ASSERT_TRUE(buffer.read_into(dst).get(absl::Seconds(30)).ok());
  ASSERT_TRUE(buffer.release().get(absl::Seconds(30)).ok());
  auto late = buffer.read_into(dst).get(absl::Seconds(30));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition) << late.status();
  EXPECT_NE(late.status().message().find("released"), std::string::npos) << late.status();
  // Another buffer of the same owner still goes over ibverbs.
  auto again = other.read_into(dst).get(absl::Seconds(30));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->transport, RdmaTransport::kIbverbs);
  EXPECT_EQ(mismatch(dst.data(), 0, 50000, 1), "");
}

// release() while the fake NIC still holds a READ and a WRITE on the buffer:
// the owner keeps the registration until this proc has drained them, so both
// finish with the right bytes, and release() resolves only then (the owner's
// memory is safe to free once it has); later operations fail before posting,
// and the connection stays up for the owner's other buffers.
TEST_F(FakeNic, ReleaseDuringInFlightOperationsLetsThemFinish) {
  RdmaBuffer buffer = make(0, 300000), other = make(0, 1000);
  TensorView dst = TensorView::Allocate(DType::kUInt8, {200000});
  TensorView src = filled(100000, 6);
  ASSERT_TRUE(buffer.read_into(dst).get(absl::Seconds(30)).ok());  // connected
  castmesh::Future<castmesh::RdmaResult> read, wrote;
  {
    ScopedEnv slow("CASTMESH_FAKE_NIC_DELAY_MS", "700");  // the fake NIC runs these after the release
    read = buffer.read_into(dst, RdmaOptions{.offset = 100000, .timeout = absl::Seconds(30)});
    wrote = buffer.write_from(src, RdmaOptions{.offset = 0, .timeout = absl::Seconds(30)});
  }
  ASSERT_TRUE(buffer.release().get(absl::Seconds(30)).ok());
  // DRAINED left this proc after both completions were reported, and RELEASED after the owner heard it.
  EXPECT_TRUE(read.ready()) << "release() resolved while a READ on the buffer was still on the NIC";
  EXPECT_TRUE(wrote.ready()) << "release() resolved while a WRITE on the buffer was still on the NIC";
  auto late = buffer.read_into(dst).get(absl::Seconds(30));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition) << late.status();
  EXPECT_NE(late.status().message().find("released"), std::string::npos) << late.status();
  auto read_done = read.get(absl::Seconds(30));
  ASSERT_TRUE(read_done.ok()) << read_done.status();
  EXPECT_EQ(read_done->transport, RdmaTransport::kIbverbs);
  EXPECT_EQ(mismatch(dst.data(), 100000, 200000, 1), "");
  auto write_done = wrote.get(absl::Seconds(30));
  ASSERT_TRUE(write_done.ok()) << write_done.status();
  TensorView small = TensorView::Allocate(DType::kUInt8, {1000});
  auto still = other.read_into(small).get(absl::Seconds(30));
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(still->transport, RdmaTransport::kIbverbs);
  EXPECT_EQ(mismatch(small.data(), 0, 1000, 1), "");
}

TEST_F(FakeNic, KilledOwnerFailsPendingOperations) {
  RdmaBuffer buffer = make(0, 300000);
  TensorView dst = TensorView::Allocate(DType::kUInt8, {300000});
  ASSERT_TRUE(buffer.read_into(dst).get(absl::Seconds(30)).ok());  // connected
  ScopedEnv slow("CASTMESH_FAKE_NIC_DELAY_MS", "60000");           // the fake NIC holds the next read
  auto pending = buffer.read_into(dst, RdmaOptions{.timeout = absl::Seconds(60)});
  ASSERT_EQ(::kill(static_cast<pid_t>(nic_procs_.proc(0).pid), SIGKILL), 0);
  auto result = pending.get(absl::Seconds(30));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
}

TEST_F(FakeNic, TimedOutReadWritesNoLateByte) {
  RdmaBuffer buffer = make(0, 300000);
  std::vector<uint8_t> memory(300000 + 2 * 4096, 0xAB);
  TensorView dst = TensorView::Contiguous(memory.data() + 4096, DType::kUInt8, {300000});
  {
    ScopedEnv slow("CASTMESH_FAKE_NIC_DELAY_MS", "1000");  // the fake NIC moves the bytes after the timeout
    auto read = buffer.read_into(dst, RdmaOptions{.timeout = absl::Milliseconds(100)}).get(absl::Seconds(30));
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDeadlineExceeded) << read.status();
  }
  // A later read on the same connection completes only after the held one
  // (RC completes in order): by then the late bytes have landed, if anywhere.
  TensorView other = TensorView::Allocate(DType::kUInt8, {300000});
  auto after = buffer.read_into(other).get(absl::Seconds(30));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->transport, RdmaTransport::kIbverbs);
  for (size_t i = 0; i < memory.size(); ++i) ASSERT_EQ(memory[i], 0xAB) << "byte " << i;
}

}  // namespace

int main(int argc, char** argv) {
  castmesh::init(argc, argv);  // worker procs never return from here
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
