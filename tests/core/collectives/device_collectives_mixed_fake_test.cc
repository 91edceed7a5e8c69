// The first device collective of a communicator where ranks disagree about
// where the buffers are (some pass device buffers, others host buffers), or
// two ranks of one process share a device: every rank ends with an error
// (or, for a host rank whose part only sends, completes), never a hang. Over
// the FAKE CUDA+NCCL plugin; ranks are members of an in-process mesh.
#include <string>

#include "castmesh/communicator.h"
#include "castmesh/tensor_engine.h"
#include "core/collectives/fake_tensor_engine.h"

namespace castmesh {
namespace {

using testing::fail;
using testing::FakeDeviceMeshTest;
using testing::gpu;
using testing::on_device;
using testing::Outcome;

// The device options of these tests: a short give-up time for the first
// call's exchange (a peer that never sends ends it; no assertion on time).
DeviceOptions soon() {
  DeviceOptions options;
  options.timeout = absl::Seconds(3);
  return options;
}

// Rank r's buffer: on its own fake GPU when `device`, else host memory.
struct Buffer {
  std::vector<float> host = std::vector<float>(4, 1.0f);
  TensorView view;
};
absl::Status make(Buffer& b, bool device, int rank) {
  if (!device) {
    b.view = TensorView::Contiguous(b.host.data(), DType::kFloat32, {4});
    return absl::OkStatus();
  }
  absl::StatusOr<TensorView> t = on_device<float>(b.host, DType::kFloat32, gpu(rank));
  if (!t.ok()) return t.status();
  b.view = *t;
  return absl::OkStatus();
}

// After the failed call the communicator still works for host collectives.
Outcome then_barrier(const absl::Status& st, Communicator& c) {
  Outcome out{st.ToString(), {}};
  out.values.push_back(c.barrier().ok() ? 1 : 0);
  return out;
}

bool mentions(const std::string& error, const char* text) { return error.find(text) != std::string::npos; }

// Two ranks: the host allreduce's messages and the device exchange's never
// match (other steps), so the device rank gives up after its timeout and
// aborts the collective, which ends the host rank's wait too.
TEST_F(FakeDeviceMeshTest, MixedHostAndDeviceAllreduceFailsOnBothRanks) {
  auto outcomes = run(2, [](Communicator& c) {
    Buffer b;
    if (absl::Status st = make(b, c.rank() == 0, c.rank()); !st.ok()) return fail(st);
    return then_barrier(c.allreduce(b.view, b.view, ReduceOp::kSum, soon()), c);
  });
  ASSERT_EQ(outcomes.size(), 2u);
  for (const Outcome& o : outcomes) EXPECT_TRUE(mentions(o.error, "first device collective")) << o.error;
  for (const Outcome& o : outcomes) EXPECT_EQ(o.values, std::vector<double>{1});
}

// Four ranks, a broadcast from a device rank: the host ranks only receive,
// from parents that run the device exchange instead; every rank fails.
TEST_F(FakeDeviceMeshTest, MixedBroadcastFromADeviceRankFailsEverywhere) {
  auto outcomes = run(4, [](Communicator& c) {
    Buffer b;
    if (absl::Status st = make(b, c.rank() % 2 == 0, c.rank()); !st.ok()) return fail(st);
    return then_barrier(c.broadcast(b.view, 0, soon()), c);
  });
  ASSERT_EQ(outcomes.size(), 4u);
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_TRUE(mentions(outcomes[r].error, "device collective")) << "rank " << r << ": " << outcomes[r].error;
    EXPECT_EQ(outcomes[r].values, std::vector<double>{1}) << "rank " << r;
  }
}

// A broadcast from a host rank: the root only sends, so it may finish before
// anything tells it; every other rank fails, none hangs.
TEST_F(FakeDeviceMeshTest, MixedBroadcastFromAHostRankFailsOnEveryOtherRank) {
  auto outcomes = run(4, [](Communicator& c) {
    Buffer b;
    if (absl::Status st = make(b, c.rank() != 1, c.rank()); !st.ok()) return fail(st);
    return then_barrier(c.broadcast(b.view, 1, soon()), c);
  });
  ASSERT_EQ(outcomes.size(), 4u);
  for (size_t r = 0; r < 4; ++r) {
    if (r != 1) {
      EXPECT_TRUE(mentions(outcomes[r].error, "device collective")) << "rank " << r << ": " << outcomes[r].error;
    }
    EXPECT_EQ(outcomes[r].values, std::vector<double>{1}) << "rank " << r;
  }
}

// Three device ranks and one host rank in an allgather.
TEST_F(FakeDeviceMeshTest, OneHostRankAmongDeviceRanksFailsEveryRank) {
  auto outcomes = run(4, [](Communicator& c) {
    Buffer in;
    if (absl::Status st = make(in, c.rank() != 2, c.rank()); !st.ok()) return fail(st);
    std::vector<float> host_out(16);
    TensorView out = TensorView::Contiguous(host_out.data(), DType::kFloat32, {16});
    if (c.rank() != 2) {
      absl::StatusOr<TensorView> d = device_empty(DType::kFloat32, {16}, gpu(c.rank()));
      if (!d.ok()) return fail(d.status());
      out = *d;
    }
    return then_barrier(c.allgather(in.view, out, soon()), c);
  });
  ASSERT_EQ(outcomes.size(), 4u);
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_TRUE(mentions(outcomes[r].error, "device collective")) << "rank " << r << ": " << outcomes[r].error;
    EXPECT_EQ(outcomes[r].values, std::vector<double>{1}) << "rank " << r;
  }
}

// Two ranks of this process on one device: refused on every rank before
// NCCL would see a duplicate GPU on some of them.
TEST_F(FakeDeviceMeshTest, TwoRanksOfOneProcessOnOneDeviceAreRefusedEverywhere) {
  auto outcomes = run(3, [](Communicator& c) {
    auto buf = on_device<float>({1, 2}, DType::kFloat32, gpu(c.rank() == 2 ? 0 : c.rank()));
    if (!buf.ok()) return fail(buf.status());
    return Outcome{c.allreduce(*buf, *buf, ReduceOp::kSum, soon()).ToString(), {}};
  });
  ASSERT_EQ(outcomes.size(), 3u);
  for (const Outcome& o : outcomes) {
    EXPECT_TRUE(mentions(o.error, "ranks 0 and 2") && mentions(o.error, "one device per rank")) << o.error;
  }
}

}  // namespace
}  // namespace castmesh
