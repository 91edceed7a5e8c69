// Device collectives across real worker procs (this binary re-executed) over
// the FAKE tensor_engine plugin with CASTMESH_FAKE_TE_NCCL=shm: the fake
// NCCL's ranks meet in a shared-memory segment its unique id names, so the
// core's cross-process unique-id exchange (rank 0 makes the id, the others get
// it over the core's host messages, keyed by the communicator) is what lets
// them meet. A proc killed during a device allreduce fails the survivors'
// requests (the fake's async error, the core's watchdog), no hang. A rank
// that passes host buffers once the device communicator exists, or whose proc
// has no tensor_engine backend, fails every rank at once naming both sides
// (the device calls' descriptors and aborts travel between the procs).
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "castmesh/communicator.h"
#include "core/testing/worker_procs.h"
#include "fake_tensor_engine.h"

namespace {

using castmesh::Communicator;
using castmesh::DType;
using castmesh::ReduceOp;
using castmesh::Request;
using castmesh::TensorView;
using castmesh::testing::gpu;
using castmesh::testing::on_device;
using castmesh::testing::to_host;

// The scenarios of these tests: one rank on its own fake GPU (registered below by name).
struct FakeDeviceScenarios {
  // Appends the device tensor's elements to got.
  static absl::Status append(const TensorView& t, std::vector<double>& got) {
    absl::StatusOr<std::vector<double>> host = to_host<float>(t);
    if (!host.ok()) return host.status();
    got.insert(got.end(), host->begin(), host->end());
    return absl::OkStatus();
  }

  static absl::Status sum_and_broadcast(Communicator& c, std::vector<double>& got) {
    const float r = static_cast<float>(c.rank());
    auto a = on_device<float>({r + 1, 10 * (r + 1)}, DType::kFloat32, gpu(c.rank()));
    if (!a.ok()) return a.status();
    if (absl::Status st = c.allreduce(*a, *a, ReduceOp::kSum); !st.ok()) return st;
    auto b = on_device<float>({100 * r + 7}, DType::kFloat32, gpu(c.rank()));
    if (!b.ok()) return b.status();
    if (absl::Status st = c.broadcast(*b, c.size() - 1); !st.ok()) return st;
    if (absl::Status st = append(*a, got); !st.ok()) return st;
    return append(*b, got);
  }

  // A dup and a split each get a device communicator of their own: requests
  // interleaved with the parent's never meet the wrong ranks.
  static absl::Status dup_and_split(Communicator& c, std::vector<double>& got) {
    absl::StatusOr<Communicator> dup = c.dup();
    if (!dup.ok()) return dup.status();
    absl::StatusOr<std::optional<Communicator>> half = c.split(c.rank() % 2, c.rank());
    if (!half.ok()) return half.status();
    const float r = static_cast<float>(c.rank());
    auto a = on_device<float>({r + 1}, DType::kFloat32, gpu(c.rank()));
    auto b = on_device<float>({c.rank() == 0 ? 2.0f : 1.0f}, DType::kFloat32, gpu(c.rank()));
    auto h = on_device<float>({r + 1}, DType::kFloat32, gpu(c.rank()));
    if (!a.ok() || !b.ok() || !h.ok()) return absl::InternalError("device buffers");
    for (int round = 0; round < 3; ++round) {
      Request ra = c.iallreduce(*a, *a, ReduceOp::kSum);
      Request rb = dup->iallreduce(*b, *b, ReduceOp::kProd);
      Request rh = (*half)->iallreduce(*h, *h, ReduceOp::kMax);
      if (absl::Status st = Request::wait_all({ra, rb, rh}, absl::Seconds(30)); !st.ok()) return st;
    }
    for (const TensorView* t : {&*a, &*b, &*h}) {
      if (absl::Status st = append(*t, got); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

  // Appends 1 when `st` failed naming `a` and `b`, else 0; then whether a
  // host barrier still works.
  static void record(Communicator& c, const absl::Status& st, const std::string& a, const std::string& b,
                     std::vector<double>& got) {
    const std::string text(st.message());
    got.push_back(!st.ok() && text.find(a) != std::string::npos && text.find(b) != std::string::npos ? 1 : 0);
    got.push_back(c.barrier().ok() ? 1 : 0);
  }

  // The device communicator exists; then rank 1 passes host buffers where
  // the others pass device buffers (default DeviceOptions: 10 min deadline).
  static absl::Status host_buffers_on_rank_one(Communicator& c, std::vector<double>& got) {
    auto a = on_device<float>({1}, DType::kFloat32, gpu(c.rank()));
    if (!a.ok()) return a.status();
    if (absl::Status st = c.allreduce(*a, *a, ReduceOp::kSum); !st.ok()) return st;
    float host = 1;
    TensorView buf = c.rank() == 1 ? TensorView::Contiguous(&host, DType::kFloat32, {1}) : *a;
    record(c, c.allreduce(buf, buf, ReduceOp::kSum), "called device allreduce(sum, float32, count=1)",
           "called allreduce(sum, float32, count=1)", got);
    return absl::OkStatus();
  }

  // Rank 1's proc has no tensor_engine backend but is handed CUDA memory (as
  // a DLPack import would be): it fails at once and so do the others' first
  // device collective, naming rank 1 (default DeviceOptions: 10 min deadline).
  static absl::Status without_backend(Communicator& c, std::vector<double>& got) {
    float fake_device_memory = 1;
    absl::StatusOr<TensorView> t = TensorView::Create(&fake_device_memory, DType::kFloat32, {1}, {1}, gpu(1));
    if (!t.ok()) return t.status();
    record(c, c.allreduce(*t, *t, ReduceOp::kSum), "device allreduce", "tensor_engine", got);
    return absl::OkStatus();
  }
  static absl::Status with_backend(Communicator& c, std::vector<double>& got) {
    auto a = on_device<float>({1}, DType::kFloat32, gpu(c.rank()));
    if (!a.ok()) return a.status();
    record(c, c.allreduce(*a, *a, ReduceOp::kSum), "rank 1", "tensor_engine", got);
    return absl::OkStatus();
  }

  // Rank 1 cannot load NCCL: every rank's first device call fails naming
  // rank 1 and the missing library, instead of ranks 0 and 2 waiting for it
  // in comm_create; host collectives go on.
  static absl::Status without_nccl_on_rank_one(Communicator& c, std::vector<double>& got) {
    auto a = on_device<float>({1}, DType::kFloat32, gpu(c.rank()));
    if (!a.ok()) return a.status();
    record(c, c.allreduce(*a, *a, ReduceOp::kSum), "rank 1 cannot join the device communicator",
           "device collectives need", got);
    return absl::OkStatus();
  }

  // The last rank's proc is SIGKILLed with its device allreduce in flight (its
  // stream held by a kernel that never ends); the others wait in theirs.
  static absl::Status last_rank_killed(Communicator& c, std::vector<double>& got) {
    auto a = on_device<float>({1}, DType::kFloat32, gpu(c.rank()));
    if (!a.ok()) return a.status();
    if (absl::Status st = c.allreduce(*a, *a, ReduceOp::kSum); !st.ok()) return st;  // the comm exists
    if (c.rank() == c.size() - 1) {
      auto stream = castmesh::DeviceStream::Create(gpu(c.rank()));
      if (!stream.ok()) return stream.status();
      castmesh::testing::fake_engine().launch(stream->handle(), [](void*) { for (;;) pause(); }, nullptr);
      Request doomed = c.iallreduce(*a, *a, ReduceOp::kSum, castmesh::DeviceOptions{.stream = *stream});
      kill(getpid(), SIGKILL);
    }
    absl::Status st = c.iallreduce(*a, *a, ReduceOp::kSum).wait(absl::Seconds(60)).status();
    if (st.ok()) return absl::InternalError("the allreduce with a dead rank succeeded");
    got.push_back(st.code() == absl::StatusCode::kUnavailable ? 1 : 0);
    got.push_back(std::string(st.message()).find("peer died") != std::string::npos ? 1 : 0);
    return absl::OkStatus();
  }
};

// Runs `fn` as one rank on its own fake GPU; the fake NCCL meets ranks
// across procs, except that with `no_nccl_on_rank_one` rank 1 has the
// backend but its collective library fails to load.
castmesh::testing::ProcScenarioFn on_fake_gpu(castmesh::testing::ProcScenarioNumbersFn fn,
                                              bool no_nccl_on_rank_one = false) {
  return [fn, no_nccl_on_rank_one](Communicator& c, std::string& out) -> absl::Status {
    setenv("CASTMESH_FAKE_TE_NCCL", no_nccl_on_rank_one && c.rank() == 1 ? "missing" : "shm", 1);
    if (castmesh::testing::fake_engine().live_comms == nullptr) {
      return absl::InternalError("the fake plugin did not load");
    }
    return castmesh::testing::joined(fn)(c, out);
  };
}

// Rank 1's proc has no tensor_engine backend; the others run on fake GPUs.
absl::Status no_backend_on_rank_one(Communicator& c, std::string& out) {
  if (c.rank() != 1) return on_fake_gpu(FakeDeviceScenarios::with_backend)(c, out);
  setenv("CASTMESH_BACKEND_PATH", "/nonexistent-castmesh-backends", 1);
  return castmesh::testing::joined(FakeDeviceScenarios::without_backend)(c, out);
}

// Every scenario answers "OK v1,v2,..." or "ERR <status>".
[[maybe_unused]] const bool registered = castmesh::testing::register_proc_scenarios({
    {"fake_device.sum_and_broadcast", on_fake_gpu(FakeDeviceScenarios::sum_and_broadcast)},
    {"fake_device.dup_and_split", on_fake_gpu(FakeDeviceScenarios::dup_and_split)},
    {"fake_device.last_rank_killed", on_fake_gpu(FakeDeviceScenarios::last_rank_killed)},
    {"fake_device.host_buffers_on_rank_one", on_fake_gpu(FakeDeviceScenarios::host_buffers_on_rank_one)},
    {"fake_device.no_backend_on_rank_one", no_backend_on_rank_one},
    {"fake_device.no_nccl_on_rank_one",
     on_fake_gpu(FakeDeviceScenarios::without_nccl_on_rank_one, /*no_nccl_on_rank_one=*/true)},
});

TEST(DeviceCollectivesAcrossProcsFake, AllreduceSumAndBroadcast) {
  for (int n : {2, 4}) {
    auto replies = castmesh::testing::run_on_worker_procs(n, "fake_device.sum_and_broadcast", absl::Seconds(60));
    ASSERT_EQ(replies.size(), static_cast<size_t>(n));
    const int sum = n * (n + 1) / 2;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(replies[r], absl::StrCat("OK ", sum, ",", 10 * sum, ",", 100 * (n - 1) + 7))
          << "n " << n << " rank " << r;
    }
  }
}

TEST(DeviceCollectivesAcrossProcsFake, DupAndSplitDoNotMixTheirIds) {
  auto replies = castmesh::testing::run_on_worker_procs(4, "fake_device.dup_and_split", absl::Seconds(60));
  ASSERT_EQ(replies.size(), 4u);
  // Three rounds: the sums of (r + 1) go 10, 40, 160; the products of
  // {2, 1, 1, 1} 2, 16, 65536; the max within {0, 2} and {1, 3} stays 3 and 4.
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(replies[r], absl::StrCat("OK 160,65536,", r % 2 == 0 ? 3 : 4)) << "rank " << r;
  }
}

TEST(DeviceCollectivesAcrossProcsFake, HostBuffersOnOneProcOnceTheDeviceCommunicatorExistsFailEveryRank) {
  auto replies = castmesh::testing::run_on_worker_procs(3, "fake_device.host_buffers_on_rank_one", absl::Seconds(60));
  ASSERT_EQ(replies.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(replies[r], "OK 1,1") << "rank " << r;
}

TEST(DeviceCollectivesAcrossProcsFake, AProcWithoutTheBackendFailsEveryRankAtOnce) {
  auto replies = castmesh::testing::run_on_worker_procs(3, "fake_device.no_backend_on_rank_one", absl::Seconds(60));
  ASSERT_EQ(replies.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(replies[r], "OK 1,1") << "rank " << r;
}

TEST(DeviceCollectivesAcrossProcsFake, AProcWithoutNcclFailsEveryRanksFirstCallAtOnce) {
  auto replies = castmesh::testing::run_on_worker_procs(3, "fake_device.no_nccl_on_rank_one", absl::Seconds(60));
  ASSERT_EQ(replies.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(replies[r], "OK 1,1") << "rank " << r;
}

TEST(DeviceCollectivesAcrossProcsFake, ProcKilledDuringAllreduceFailsTheSurvivorsRequests) {
  const int n = 3;
  castmesh::testing::WorkerProcs procs(n, {.continue_on_failure = true});
  ASSERT_TRUE(procs.ok());
  const int survivors = procs.run_with_dead_rank(
      "fake_device.last_rank_killed", n - 1, absl::Seconds(90), [](int rank, const std::string& reply) {
        EXPECT_EQ(reply, "OK 1,1") << "rank " << rank;  // Unavailable, "peer died"
      });
  EXPECT_EQ(survivors, n - 1);
}

}  // namespace
