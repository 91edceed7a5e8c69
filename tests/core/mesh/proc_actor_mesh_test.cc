// ActorMesh over the procs of a ProcMesh: real worker processes (this test
// binary re-executed; castmesh::init in main() turns them into workers).
#include <signal.h>

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>

#include "castmesh/actor_mesh.h"
#include "castmesh/proc_mesh.h"
#include "core/testing/digits_actor.h"

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
    auto mesh = ActorMesh<Digits>::Spawn(*procs, shape, options);
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

// A member whose handler throws stops alone; its proc lives on. The mesh
// records the dead point (through the remote monitor of the member), a call
// including it fails at once naming it, the survivors keep working.
TEST(ProcActorMesh, MemberThatFailsAloneInALiveProcIsRecordedDead) {
  castmesh::Runtime runtime;
  auto procs = castmesh::LocalAllocator().allocate(runtime, 4);
  ASSERT_TRUE(procs.ok()) << procs.status();
  Shape shape = *Shape::Create({{"hosts", 2}, {"gpus", 2}});
  std::mutex mu;
  std::condition_variable cv;
  std::vector<MeshEvent> failures;
  MeshOptions options;
  options.name = "lone";
  options.on_failure = [&](const MeshEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    failures.push_back(e);
    cv.notify_all();
    return MeshFailureAction::kContinue;
  };
  auto mesh = ActorMesh<Digits>::Spawn(*procs, shape, options);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ASSERT_TRUE(mesh->cast(Add{1}).ok());

  auto member = mesh->slice({{"hosts", 0}, {"gpus", 1}});
  ASSERT_TRUE(member.ok()) << member.status();
  absl::Status failed = member->call_one(Fail{}).get(absl::Seconds(20)).status();
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("{hosts=0, gpus=1}"), std::string::npos) << failed;
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(10), [&] { return !failures.empty(); });
    ASSERT_EQ(failures.size(), 1u);
    EXPECT_EQ(failures[0].point.to_string(), "{hosts=0, gpus=1}");
    EXPECT_EQ(failures[0].actor, member->refs()[0].address());
    EXPECT_NE(failures[0].reason.message().find("member gave up"), std::string::npos) << failures[0].reason;
  }
  ASSERT_EQ(mesh->events().size(), 1u);

  // A call over the whole mesh fails at once, naming the dead point.
  absl::Status st = mesh->call(Get{}).get(absl::Seconds(20)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("{hosts=0, gpus=1}"), std::string::npos) << st;
  // The survivors answer, and the dead member's proc is alive and serving.
  auto survivors = mesh->slice("gpus", 0)->call(Get{}).get(absl::Seconds(20));
  ASSERT_TRUE(survivors.ok()) << survivors.status();
  EXPECT_EQ(survivors->values(), (std::vector<int64_t>{1, 1}));
  auto probes = procs->spawn<Digits>("probe");
  ASSERT_TRUE(probes.ok()) << probes.status();
  auto pid = (*probes)[1].ask(Pid{}).get(absl::Seconds(20));
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(*pid, procs->proc(1).pid);
  mesh->stop();
  EXPECT_EQ(mesh->events().size(), 1u);  // stopping the rest is no failure
  EXPECT_TRUE(procs->stop().ok());
}

// Without a shape, an ActorMesh takes its proc mesh's (or slice's).
TEST(ProcActorMesh, SpawnTakesTheProcMeshShape) {
  castmesh::Runtime runtime;
  Shape shape = *Shape::Create({{"hosts", 2}, {"gpus", 2}});
  auto procs = castmesh::LocalAllocator().allocate(runtime, shape);
  ASSERT_TRUE(procs.ok()) << procs.status();
  MeshOptions options;
  options.name = "whole";
  auto mesh = ActorMesh<Digits>::Spawn(*procs, options);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->shape(), shape);
  auto pids = mesh->call(Pid{}).get(absl::Seconds(20));
  ASSERT_TRUE(pids.ok()) << pids.status();
  for (const auto& [point, pid] : pids->items()) EXPECT_EQ(pid, procs->proc(point.rank()).pid) << point;

  // Over the slice gpus=1: one member per proc of the slice (ranks 1, 3).
  auto gpu1 = procs->slice("gpus", 1);
  ASSERT_TRUE(gpu1.ok()) << gpu1.status();
  options.name = "gpu1";
  auto sub = ActorMesh<Digits>::Spawn(*gpu1, options);
  ASSERT_TRUE(sub.ok()) << sub.status();
  EXPECT_EQ(sub->shape(), *Shape::Create({{"hosts", 2}}));
  auto sub_pids = sub->call(Pid{}).get(absl::Seconds(20));
  ASSERT_TRUE(sub_pids.ok()) << sub_pids.status();
  EXPECT_EQ(sub_pids->values(), (std::vector<int64_t>{procs->proc(1).pid, procs->proc(3).pid}));
  mesh->stop();
  sub->stop();
  EXPECT_TRUE(procs->stop().ok());
}

TEST(ProcActorMesh, ShapeMustMatchTheProcs) {
  castmesh::Runtime runtime;
  auto procs = castmesh::LocalAllocator().allocate(runtime, 2);
  ASSERT_TRUE(procs.ok()) << procs.status();
  auto mesh = ActorMesh<Digits>::Spawn(*procs, *Shape::Create({{"x", 3}}), MeshOptions{});
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(procs->stop().ok());
}

}  // namespace
