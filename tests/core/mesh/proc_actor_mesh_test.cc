// ActorMesh over the procs of a ProcMesh: real worker processes (this test
// binary re-executed; castmesh::init in main() turns them into workers).
#include <signal.h>

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>

#include "absl/strings/numbers.h"
#include "castmesh/actor_mesh.h"
#include "castmesh/proc_mesh.h"

namespace {

struct Add {
  int64_t n = 0;
};
struct Get {};
struct Pid {};

absl::Status encode_add(const Add& m, std::string* out) {
  *out = std::to_string(m.n);
  return absl::OkStatus();
}
absl::Status decode_add(std::string_view b, Add* m) {
  return absl::SimpleAtoi(absl::string_view(b.data(), b.size()), &m->n) ? absl::OkStatus()
                                                                       : absl::InvalidArgumentError("bad Add");
}
absl::Status encode_get(const Get&, std::string* out) { return out->clear(), absl::OkStatus(); }
absl::Status decode_get(std::string_view, Get*) { return absl::OkStatus(); }
absl::Status encode_pid(const Pid&, std::string* out) { return out->clear(), absl::OkStatus(); }
absl::Status decode_pid(std::string_view, Pid*) { return absl::OkStatus(); }

}  // namespace

CASTMESH_REGISTER_MESSAGE(Add, "castmesh.test.mesh.Add", encode_add, decode_add);
CASTMESH_REGISTER_MESSAGE(Get, "castmesh.test.mesh.Get", encode_get, decode_get);
CASTMESH_REGISTER_MESSAGE(Pid, "castmesh.test.mesh.Pid", encode_pid, decode_pid);

namespace {

// Keeps the values it was cast, in order, as a number: each Add appends a
// digit, so the order of delivery is visible in the sum.
class Accumulator : public castmesh::Actor {
 public:
  void add(const Add& m) { value_ = value_ * 10 + m.n; }
  int64_t get(const Get&) { return value_; }
  int64_t pid(const Pid&) { return static_cast<int64_t>(::getpid()); }
  using Handlers = castmesh::Handlers<&Accumulator::add, &Accumulator::get, &Accumulator::pid>;

 private:
  int64_t value_ = 0;
};

}  // namespace

CASTMESH_REGISTER_ACTOR(Accumulator);

namespace {

using castmesh::ActorMesh;
using castmesh::MeshEvent;
using castmesh::MeshFailureAction;
using castmesh::MeshOptions;
using castmesh::Range;
using castmesh::Shape;

TEST(ProcActorMesh, CastCallReduceAndAKilledProc) {
  castmesh::Runtime runtime;
  auto procs = castmesh::LocalAllocator().allocate(runtime, 4);
  ASSERT_TRUE(procs.ok()) << procs.status();
  Shape shape = *Shape::Create({{"hosts", 2}, {"gpus", 2}});

  std::mutex mu;
  std::vector<std::string> failed_points;
  MeshOptions options;
  options.name = "acc";
  options.fanout = 2;
  options.on_failure = [&](const MeshEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    failed_points.push_back(e.point.to_string());
    return MeshFailureAction::kContinue;
  };
  {
    auto mesh = ActorMesh<Accumulator>::Spawn(*procs, shape, options);
    ASSERT_TRUE(mesh.ok()) << mesh.status();

    // Each member runs in its own proc.
    auto pids = mesh->call(Pid{}).get(absl::Seconds(20));
    ASSERT_TRUE(pids.ok()) << pids.status();
    for (const auto& [point, pid] : pids->items()) {
      EXPECT_EQ(pid, procs->proc(point.rank()).pid) << point;
      EXPECT_NE(pid, static_cast<int64_t>(::getpid()));
    }

    // Casts to the mesh and to slices arrive in order at every member.
    ASSERT_TRUE(mesh->cast(Add{1}).ok());
    ASSERT_TRUE(mesh->slice("gpus", 1)->cast(Add{2}).ok());
    ASSERT_TRUE(mesh->slice("hosts", 0)->cast(Add{3}).ok());
    ASSERT_TRUE(mesh->cast(Add{4}).ok());
    auto values = mesh->call(Get{}).get(absl::Seconds(20));
    ASSERT_TRUE(values.ok()) << values.status();
    EXPECT_EQ(values->values(), (std::vector<int64_t>{134, 1234, 14, 124}));
    EXPECT_EQ(*mesh->call(Get{}, castmesh::reducers::sum<int64_t>()).get(absl::Seconds(20)),
              134 + 1234 + 14 + 124);

    // SIGKILL the proc of {hosts=1, gpus=0}: the mesh reports the point, a
    // call including it fails naming it, the survivors still answer.
    ASSERT_EQ(::kill(static_cast<pid_t>(procs->proc(2).pid), SIGKILL), 0);
    for (int i = 0; i < 5000; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!failed_points.empty()) break;
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(failed_points, std::vector<std::string>{"{hosts=1, gpus=0}"});
    }
    absl::Status st = mesh->call(Get{}).get(absl::Seconds(20)).status();
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("{hosts=1, gpus=0}"), std::string::npos) << st;
    auto survivors = mesh->slice("hosts", 0)->call(Get{}).get(absl::Seconds(20));
    ASSERT_TRUE(survivors.ok()) << survivors.status();
    EXPECT_EQ(survivors->values(), (std::vector<int64_t>{134, 1234}));
  }
  EXPECT_TRUE(procs->stop().ok());
}

TEST(ProcActorMesh, ShapeMustMatchTheProcs) {
  castmesh::Runtime runtime;
  auto procs = castmesh::LocalAllocator().allocate(runtime, 2);
  ASSERT_TRUE(procs.ok()) << procs.status();
  auto mesh = ActorMesh<Accumulator>::Spawn(*procs, *Shape::Create({{"x", 3}}), MeshOptions{});
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(procs->stop().ok());
}

}  // namespace

int main(int argc, char** argv) {
  castmesh::init(argc, argv);  // worker procs never return from here
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
