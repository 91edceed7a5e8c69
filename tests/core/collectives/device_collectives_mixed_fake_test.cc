// Device collectives where ranks disagree: some pass device buffers, others
// host buffers, at the first device collective of a communicator or once its
// device communicator exists; different device collectives at one collective
// number; two ranks of one process on one device. Every rank ends with an
// error naming both sides (or, for a host rank whose part only sends,
// completes), found by the descriptors device calls send (no timeout
// involved), never a hang. Over the FAKE CUDA+NCCL plugin; ranks are members
// of an in-process mesh.
#include <string>

#include "castmesh/communicator.h"
#include "castmesh/tensor_engine.h"
#include "core/collectives/fake_tensor_engine.h"

namespace castmesh {
namespace {

using testing::fail;
using testing::fake_engine;
using testing::FakeDeviceMeshTest;
using testing::Gate;
using testing::gpu;
using testing::on_device;
using testing::Outcome;

// The device options of the first-call tests: a short give-up time for the
// first call's exchange, so a missed mismatch fails the test (with another
// message) instead of hanging it.
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

bool mentions(const std::string& error, const std::string& text) { return error.find(text) != std::string::npos; }

// The error names the mismatch and both calls ("rank 0 called device
// allreduce(...), this rank called allreduce(...)", either way round).
bool names_both(const std::string& error, const std::string& device_call, const std::string& host_call) {
  return mentions(error, "mismatched collective") && mentions(error, "called device " + device_call) &&
         mentions(error, "called " + host_call);
}

// Both ranks of a sum-vs-max device mismatch failed naming both calls, and
// their host barrier afterwards worked.
void expect_sum_and_max_named_on_both_ranks(const std::vector<Outcome>& outcomes) {
  ASSERT_EQ(outcomes.size(), 2u);
  for (const Outcome& o : outcomes) {
    EXPECT_TRUE(mentions(o.error, "mismatched collective") && mentions(o.error, "device allreduce(sum, float32") &&
                mentions(o.error, "device allreduce(max, float32"))
        << o.error;
    EXPECT_EQ(o.values, std::vector<double>{1});
  }
}

// Two ranks: the host allreduce's messages and the device exchange's never
// match (other steps); the device rank's descriptor fails the host rank's
// receive, whose abort ends the device rank's exchange.
TEST_F(FakeDeviceMeshTest, MixedHostAndDeviceAllreduceFailsOnBothRanks) {
  auto outcomes = run(2, [](Communicator& c) {
    Buffer b;
    if (absl::Status st = make(b, c.rank() == 0, c.rank()); !st.ok()) return fail(st);
    return then_barrier(c.allreduce(b.view, b.view, ReduceOp::kSum, soon()), c);
  });
  ASSERT_EQ(outcomes.size(), 2u);
  for (const Outcome& o : outcomes) {
    EXPECT_TRUE(names_both(o.error, "allreduce(sum, float32, count=4)", "allreduce(sum, float32, count=4)")) << o.error;
    EXPECT_EQ(o.values, std::vector<double>{1});
  }
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
    EXPECT_TRUE(names_both(outcomes[r].error, "broadcast(float32, count=4, root=0)", "broadcast(float32, count=4, root=0)"))
        << "rank " << r << ": " << outcomes[r].error;
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
      EXPECT_TRUE(names_both(outcomes[r].error, "broadcast(float32, count=4, root=1)",
                             "broadcast(float32, count=4, root=1)"))
          << "rank " << r << ": " << outcomes[r].error;
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
    EXPECT_TRUE(names_both(outcomes[r].error, "allgather(float32, count=4)", "allgather(float32, count=4)"))
        << "rank " << r << ": " << outcomes[r].error;
    EXPECT_EQ(outcomes[r].values, std::vector<double>{1}) << "rank " << r;
  }
}

// Once the device communicator exists, one rank passes host buffers: its
// host allreduce meets the device ranks' descriptors, and the device ranks'
// NCCL work (which would wait for it until DeviceOptions.timeout, 10 minutes
// here) fails through the abort. Every rank names both calls; the device
// communicator is aborted; host collectives go on.
TEST_F(FakeDeviceMeshTest, HostBuffersOnOneRankOnceTheDeviceCommunicatorExistsFailEveryRank) {
  for (int n : {2, 3}) {
    auto outcomes = run(n, [](Communicator& c) {
      Buffer first;
      if (absl::Status st = make(first, true, c.rank()); !st.ok()) return fail(st);
      if (absl::Status st = c.allreduce(first.view, first.view, ReduceOp::kSum); !st.ok()) return fail(st);
      Buffer b;
      if (absl::Status st = make(b, c.rank() != 1, c.rank()); !st.ok()) return fail(st);
      Outcome out = then_barrier(c.allreduce(b.view, b.view, ReduceOp::kSum), c);
      if (c.rank() != 1) {  // this rank's device communicator was aborted
        const absl::Status later = c.allreduce(first.view, first.view, ReduceOp::kSum);
        out.values.push_back(later.code() == absl::StatusCode::kFailedPrecondition ? 1 : 0);
      }
      return out;
    });
    ASSERT_EQ(outcomes.size(), static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(names_both(outcomes[r].error, "allreduce(sum, float32, count=4)", "allreduce(sum, float32, count=4)"))
          << "n " << n << " rank " << r << ": " << outcomes[r].error;
      EXPECT_EQ(outcomes[r].values, (r == 1 ? std::vector<double>{1} : std::vector<double>{1, 1})) << "rank " << r;
    }
  }
}

// Two different device collectives at one collective number (sum on rank 0,
// max on rank 1): each rank's stream is held, so neither NCCL call can run
// before the descriptors are compared; both fail naming both calls.
TEST_F(FakeDeviceMeshTest, DifferentDeviceCollectivesAtOneNumberFailBothRanks) {
  auto outcomes = run(2, [](Communicator& c) {
    Buffer b;
    if (absl::Status st = make(b, true, c.rank()); !st.ok()) return fail(st);
    if (absl::Status st = c.allreduce(b.view, b.view, ReduceOp::kSum); !st.ok()) return fail(st);
    auto stream = DeviceStream::Create(gpu(c.rank()));
    if (!stream.ok()) return fail(stream.status());
    Gate gate;
    fake_engine().launch(stream->handle(), &Gate::wait, &gate);
    Request r = c.iallreduce(b.view, b.view, c.rank() == 0 ? ReduceOp::kSum : ReduceOp::kMax,
                             DeviceOptions{.stream = *stream});
    absl::Status st = r.wait(absl::Seconds(30)).status();
    gate.release();
    // The gate lives on this stack: the stream must be done with it (the
    // aborted NCCL call ends) before it goes.
    (void)stream->synchronize();
    return then_barrier(st, c);
  });
  expect_sum_and_max_named_on_both_ranks(outcomes);
}

// The same at the first device collective: the id exchange carries the
// call's signature, so the two calls meet there and neither makes an NCCL
// communicator.
TEST_F(FakeDeviceMeshTest, DifferentDeviceCollectivesAtTheFirstCallFailBothRanks) {
  auto outcomes = run(2, [](Communicator& c) {
    Buffer b;
    if (absl::Status st = make(b, true, c.rank()); !st.ok()) return fail(st);
    return then_barrier(c.allreduce(b.view, b.view, c.rank() == 0 ? ReduceOp::kSum : ReduceOp::kMax, soon()), c);
  });
  expect_sum_and_max_named_on_both_ranks(outcomes);
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
