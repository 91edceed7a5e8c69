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

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "castmesh/actor_mesh.h"
#include "castmesh/communicator.h"
#include "castmesh/proc_mesh.h"
#include "fake_tensor_engine.h"

namespace {

// Which scenario a member runs (see FakeDeviceMember::run).
struct FakeDeviceScenario {
  int64_t which = 0;
};
absl::Status encode_scenario(const FakeDeviceScenario& m, std::string* out) {
  *out = std::to_string(m.which);
  return absl::OkStatus();
}
absl::Status decode_scenario(std::string_view b, FakeDeviceScenario* m) {
  return absl::SimpleAtoi(absl::string_view(b.data(), b.size()), &m->which)
             ? absl::OkStatus()
             : absl::InvalidArgumentError("bad FakeDeviceScenario");
}

}  // namespace

CASTMESH_REGISTER_MESSAGE(FakeDeviceScenario, "castmesh.test.collectives.FakeDeviceScenario", encode_scenario,
                          decode_scenario);

namespace {

using castmesh::Communicator;
using castmesh::DType;
using castmesh::ReduceOp;
using castmesh::Request;
using castmesh::TensorView;
using castmesh::testing::gpu;
using castmesh::testing::on_device;
using castmesh::testing::to_host;

constexpr int64_t kSumAndBroadcast = 1;
constexpr int64_t kDupAndSplit = 2;
constexpr int64_t kLastRankKilled = 3;
constexpr int64_t kHostBuffersOnRankOne = 4;
constexpr int64_t kNoBackendOnRankOne = 5;
constexpr int64_t kNoNcclOnRankOne = 6;

// A member proc: one rank on its own fake GPU. Answers "OK v1,v2,..." or "ERR <status>".
class FakeDeviceMember : public castmesh::Actor {
 public:
  std::string run(const FakeDeviceScenario& m) {
    absl::StatusOr<Communicator> comm = Communicator::current();
    if (!comm.ok()) return "ERR " + comm.status().ToString();
    if (m.which == kNoBackendOnRankOne && comm->rank() == 1) {
      setenv("CASTMESH_BACKEND_PATH", "/nonexistent-castmesh-backends", 1);
      std::vector<double> got;
      absl::Status st = without_backend(*comm, got);
      return st.ok() ? "OK " + absl::StrJoin(got, ",") : "ERR " + st.ToString();
    }
    // The fake NCCL meets ranks across procs; rank 1 of kNoNcclOnRankOne has
    // the backend but its collective library fails to load.
    setenv("CASTMESH_FAKE_TE_NCCL", m.which == kNoNcclOnRankOne && comm->rank() == 1 ? "missing" : "shm", 1);
    if (castmesh::testing::fake_engine().live_comms == nullptr) return "ERR the fake plugin did not load";
    std::vector<double> got;
    absl::Status st = m.which == kSumAndBroadcast       ? sum_and_broadcast(*comm, got)
                      : m.which == kDupAndSplit         ? dup_and_split(*comm, got)
                      : m.which == kHostBuffersOnRankOne ? host_buffers_on_rank_one(*comm, got)
                      : m.which == kNoBackendOnRankOne   ? with_backend(*comm, got)
                      : m.which == kNoNcclOnRankOne      ? without_nccl_on_rank_one(*comm, got)
                                                         : last_rank_killed(*comm, got);
    if (!st.ok()) return "ERR " + st.ToString();
    return "OK " + absl::StrJoin(got, ",");
  }
  using Handlers = castmesh::Handlers<&FakeDeviceMember::run>;

 private:
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

}  // namespace

CASTMESH_REGISTER_ACTOR(FakeDeviceMember);

namespace {

// Starts n worker procs with a member each; `continue_on_failure` keeps the
// mesh up when one dies.
struct FakeDeviceProcs {
  explicit FakeDeviceProcs(int n, bool continue_on_failure = false) {
    auto p = castmesh::LocalAllocator().allocate(runtime, n);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return;
    procs.emplace(std::move(*p));
    castmesh::MeshOptions options{.name = "fakegpu"};
    if (continue_on_failure) {
      options.on_failure = [](const castmesh::MeshEvent&) { return castmesh::MeshFailureAction::kContinue; };
    }
    auto m = castmesh::ActorMesh<FakeDeviceMember>::Spawn(*procs, options);
    EXPECT_TRUE(m.ok()) << m.status();
    if (m.ok()) mesh.emplace(std::move(*m));
  }
  ~FakeDeviceProcs() {
    if (procs) (void)procs->stop();
  }
  castmesh::Runtime runtime;
  std::optional<castmesh::ProcMesh> procs;
  std::optional<castmesh::ActorMesh<FakeDeviceMember>> mesh;
};

TEST(DeviceCollectivesAcrossProcsFake, AllreduceSumAndBroadcast) {
  for (int n : {2, 4}) {
    FakeDeviceProcs p(n);
    ASSERT_TRUE(p.mesh.has_value());
    auto replies = p.mesh->call(FakeDeviceScenario{kSumAndBroadcast}).get(absl::Seconds(60));
    ASSERT_TRUE(replies.ok()) << replies.status();
    const int sum = n * (n + 1) / 2;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(replies->values()[r], absl::StrCat("OK ", sum, ",", 10 * sum, ",", 100 * (n - 1) + 7))
          << "n " << n << " rank " << r;
    }
  }
}

TEST(DeviceCollectivesAcrossProcsFake, DupAndSplitDoNotMixTheirIds) {
  FakeDeviceProcs p(4);
  ASSERT_TRUE(p.mesh.has_value());
  auto replies = p.mesh->call(FakeDeviceScenario{kDupAndSplit}).get(absl::Seconds(60));
  ASSERT_TRUE(replies.ok()) << replies.status();
  // Three rounds: the sums of (r + 1) go 10, 40, 160; the products of
  // {2, 1, 1, 1} 2, 16, 65536; the max within {0, 2} and {1, 3} stays 3 and 4.
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(replies->values()[r], absl::StrCat("OK 160,65536,", r % 2 == 0 ? 3 : 4)) << "rank " << r;
  }
}

TEST(DeviceCollectivesAcrossProcsFake, HostBuffersOnOneProcOnceTheDeviceCommunicatorExistsFailEveryRank) {
  FakeDeviceProcs p(3);
  ASSERT_TRUE(p.mesh.has_value());
  auto replies = p.mesh->call(FakeDeviceScenario{kHostBuffersOnRankOne}).get(absl::Seconds(60));
  ASSERT_TRUE(replies.ok()) << replies.status();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(replies->values()[r], "OK 1,1") << "rank " << r;
}

TEST(DeviceCollectivesAcrossProcsFake, AProcWithoutTheBackendFailsEveryRankAtOnce) {
  FakeDeviceProcs p(3);
  ASSERT_TRUE(p.mesh.has_value());
  auto replies = p.mesh->call(FakeDeviceScenario{kNoBackendOnRankOne}).get(absl::Seconds(60));
  ASSERT_TRUE(replies.ok()) << replies.status();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(replies->values()[r], "OK 1,1") << "rank " << r;
}

TEST(DeviceCollectivesAcrossProcsFake, AProcWithoutNcclFailsEveryRanksFirstCallAtOnce) {
  FakeDeviceProcs p(3);
  ASSERT_TRUE(p.mesh.has_value());
  auto replies = p.mesh->call(FakeDeviceScenario{kNoNcclOnRankOne}).get(absl::Seconds(60));
  ASSERT_TRUE(replies.ok()) << replies.status();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(replies->values()[r], "OK 1,1") << "rank " << r;
}

TEST(DeviceCollectivesAcrossProcsFake, ProcKilledDuringAllreduceFailsTheSurvivorsRequests) {
  const int n = 3;
  FakeDeviceProcs p(n, /*continue_on_failure=*/true);
  ASSERT_TRUE(p.mesh.has_value());
  auto stream = p.mesh->stream(FakeDeviceScenario{kLastRankKilled});
  int survivors = 0;
  for (int i = 0; i < n; ++i) {
    auto next = stream.next(absl::Seconds(90));
    ASSERT_TRUE(next.ok()) << next.status();
    const auto& [point, reply] = *next;
    if (point.rank() == n - 1) {
      EXPECT_FALSE(reply.ok());  // its proc was killed
      continue;
    }
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(*reply, "OK 1,1") << "rank " << point.rank();  // Unavailable, "peer died"
    ++survivors;
  }
  EXPECT_EQ(survivors, n - 1);
}

}  // namespace
