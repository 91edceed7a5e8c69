// ActorMesh over in-process actors: cast along the tree (ordering across
// slices), call -> ValueMesh, reductions, call_one, choose, stream, slices of
// slices, and supervision (a member killed during a call).
#include "castmesh/actor_mesh.h"

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <thread>

namespace castmesh {
namespace {

struct Add {
  int n;
};
struct GetLog {};
struct WhoAmI {};
struct Name {};
struct FailAt {
  uint64_t rank;
};
struct SlowUnless {
  uint64_t fail_rank;
};

// A member records what it is cast, answers with its rank, and fails on
// request. Its rank is the index of its address (members are proc/name[rank]).
class Worker : public Actor {
 public:
  explicit Worker(std::string tag) : tag_(std::move(tag)) {}
  void add(const Add& m) { log_.push_back(m.n); }
  std::vector<int> log(const GetLog&) { return log_; }
  int64_t who(const WhoAmI&) { return static_cast<int64_t>(address().index); }
  std::string name(const Name&) { return tag_ + std::to_string(address().index); }
  int64_t fail_at(const FailAt& m) {
    if (address().index == m.rank) throw std::runtime_error("boom at " + std::to_string(m.rank));
    return static_cast<int64_t>(address().index);
  }
  int64_t slow_unless(const SlowUnless& m) {
    if (address().index == m.fail_rank) throw std::runtime_error("killed during the call");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return 1;
  }
  using Handlers = castmesh::Handlers<&Worker::add, &Worker::log, &Worker::who, &Worker::name,
                                      &Worker::fail_at, &Worker::slow_unless>;

 private:
  std::string tag_;
  std::vector<int> log_;
};

Shape shape_2x4() { return *Shape::Create({{"hosts", 2}, {"gpus", 4}}); }

class ActorMeshTest : public ::testing::Test {
 protected:
  static RuntimeOptions two_workers() {
    RuntimeOptions options;
    options.workers = 2;
    return options;
  }
  ActorMeshTest() : runtime_(two_workers()) {}
  ActorMesh<Worker> spawn(const Shape& shape, MeshOptions options = {}) {
    if (options.name.empty()) options.name = "worker";
    absl::StatusOr<ActorMesh<Worker>> mesh = ActorMesh<Worker>::Spawn(runtime_, shape, options, std::string("w"));
    EXPECT_TRUE(mesh.ok()) << mesh.status();
    return *mesh;
  }
  Runtime runtime_;
};

TEST_F(ActorMeshTest, CallGivesAValuePerPoint) {
  ActorMesh<Worker> mesh = spawn(shape_2x4());
  EXPECT_EQ(mesh.size(), 8u);
  EXPECT_EQ(mesh.name(), "worker");
  absl::StatusOr<ValueMesh<int64_t>> ranks = mesh.call(WhoAmI{}).get(absl::Seconds(10));
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_EQ(ranks->shape(), mesh.shape());
  for (const auto& [point, rank] : ranks->items()) EXPECT_EQ(static_cast<size_t>(rank), point.rank());
  EXPECT_EQ(*ranks->at({{"hosts", 1}, {"gpus", 2}}), 6);
  absl::StatusOr<ValueMesh<std::string>> names = mesh.call(Name{}).get(absl::Seconds(10));
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names->values().front(), "w0");
}

TEST_F(ActorMeshTest, SlicesAndSlicesOfSlicesAddressTheRightMembers) {
  ActorMesh<Worker> mesh = spawn(shape_2x4());
  ActorMesh<Worker> gpu1 = *mesh.slice("gpus", 1);
  EXPECT_EQ(gpu1.shape().labels(), std::vector<std::string>{"hosts"});
  EXPECT_EQ(mesh.call(WhoAmI{}).get()->values().size(), 8u);
  EXPECT_EQ(gpu1.call(WhoAmI{}).get()->values(), (std::vector<int64_t>{1, 5}));
  ActorMesh<Worker> odd = *mesh.slice({{"gpus", Range(1, 4, 2)}});
  ActorMesh<Worker> odd_h1 = *odd.slice("hosts", 1);
  EXPECT_EQ(odd_h1.call(WhoAmI{}).get()->values(), (std::vector<int64_t>{5, 7}));
  ActorMesh<Worker> one = *odd_h1.slice("gpus", 1);
  EXPECT_EQ(*one.call_one(WhoAmI{}).get(), 7);
  // Errors name the member's point in the mesh as spawned, not in the slice.
  absl::Status failed = one.call_one(FailAt{7}).get(absl::Seconds(10)).status();
  EXPECT_NE(failed.message().find("{hosts=1, gpus=3}"), std::string::npos) << failed;
  EXPECT_EQ(mesh.slice("gpu", 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(mesh.slice("gpus", 9).status().code(), absl::StatusCode::kOutOfRange);
  absl::Status not_one = mesh.call_one(WhoAmI{}).get().status();
  EXPECT_EQ(not_one.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(not_one.message().find("call_one"), std::string::npos) << not_one;
}

// Casts to the whole mesh and to different slices, interleaved, from one
// sender: every member sees exactly the casts that targeted it, in order.
TEST_F(ActorMeshTest, CastsFromOneSenderArriveInOrderAcrossSlices) {
  for (size_t fanout : {1u, 2u, 8u}) {
    MeshOptions options{.name = "ordered" + std::to_string(fanout), .fanout = fanout};
    ActorMesh<Worker> mesh = spawn(*Shape::Create({{"hosts", 4}, {"gpus", 4}}), options);
    std::vector<ActorMesh<Worker>> views = {
        mesh, *mesh.slice("gpus", 1), *mesh.slice("hosts", Range(1, 4, 2)),
        *mesh.slice({{"hosts", 3}, {"gpus", Range::every(3)}})};
    std::vector<std::vector<int>> expected(mesh.size());
    for (int i = 0; i < 200; ++i) {
      const ActorMesh<Worker>& view = views[static_cast<size_t>(i * 7 + i / 3) % views.size()];
      ASSERT_TRUE(view.cast(Add{i}).ok());
      for (size_t rank : view.shape().slice().ranks()) expected[rank].push_back(i);
    }
    absl::StatusOr<ValueMesh<std::vector<int>>> logs = mesh.call(GetLog{}).get(absl::Seconds(20));
    ASSERT_TRUE(logs.ok()) << logs.status();
    for (const auto& [point, log] : logs->items()) {
      EXPECT_EQ(log, expected[point.rank()]) << "fanout " << fanout << " at " << point;
    }
  }
}

TEST_F(ActorMeshTest, ReductionsFoldInRowMajorOrder) {
  ActorMesh<Worker> mesh = spawn(*Shape::Create({{"hosts", 4}, {"gpus", 4}}), {.name = "r", .fanout = 2});
  EXPECT_EQ(*mesh.call(WhoAmI{}, reducers::sum<int64_t>()).get(absl::Seconds(10)), 120);
  EXPECT_EQ(*mesh.call(WhoAmI{}, reducers::max<int64_t>()).get(absl::Seconds(10)), 15);
  ActorMesh<Worker> even = *mesh.slice("gpus", Range::every(2));
  EXPECT_EQ(*even.call(WhoAmI{}, reducers::min<int64_t>()).get(absl::Seconds(10)), 0);
  EXPECT_EQ(*even.call(WhoAmI{}, reducers::sum<int64_t>()).get(absl::Seconds(10)),
            0 + 2 + 4 + 6 + 8 + 10 + 12 + 14);
  // Non-commutative: the tree must keep row-major order.
  auto concat = reducers::custom<std::string>("concat", [](std::string a, std::string b) { return a + "," + b; });
  EXPECT_EQ(*mesh.slice("hosts", Range(1, 3))->call(Name{}, concat).get(absl::Seconds(10)),
            "w4,w5,w6,w7,w8,w9,w10,w11");
}

TEST_F(ActorMeshTest, DirectAndTreeFanoutGiveTheSameReplies) {
  ActorMesh<Worker> mesh = spawn(*Shape::Create({{"x", 64}}), {.name = "big", .fanout = 8});
  auto tree = mesh.call(WhoAmI{}).get(absl::Seconds(20));
  auto direct = mesh.with_fanout(64).call(WhoAmI{}).get(absl::Seconds(20));
  ASSERT_TRUE(tree.ok() && direct.ok());
  EXPECT_EQ(tree->values(), direct->values());
  EXPECT_EQ(tree->values().back(), 63);
}

TEST_F(ActorMeshTest, ChooseAndStream) {
  ActorMesh<Worker> mesh = spawn(shape_2x4());
  std::set<int64_t> chosen;
  for (int i = 0; i < 40; ++i) {
    absl::StatusOr<int64_t> r = mesh.choose(WhoAmI{}).get(absl::Seconds(10));
    ASSERT_TRUE(r.ok()) << r.status();
    // Each answer came before the next choose: every member is idle, so
    // equals take turns round-robin (as Python's choose).
    EXPECT_EQ(*r, i % 8) << "choice " << i;
    chosen.insert(*r);
  }
  EXPECT_EQ(chosen.size(), 8u) << "choose spreads requests over members";

  ReplyStream<int64_t> stream = mesh.slice("hosts", 1)->stream(WhoAmI{});
  EXPECT_EQ(stream.size(), 4u);
  std::set<size_t> seen;
  for (size_t i = 0; i < 4; ++i) {
    auto item = stream.next(absl::Seconds(10));
    ASSERT_TRUE(item.ok()) << item.status();
    ASSERT_TRUE(item->second.ok());
    EXPECT_EQ(static_cast<size_t>(*item->second), item->first.rank());
    seen.insert(item->first.rank());
  }
  EXPECT_EQ(seen, (std::set<size_t>{4, 5, 6, 7}));
  EXPECT_EQ(stream.next(absl::Milliseconds(1)).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(ActorMeshTest, MemberKilledDuringCallFailsTheCallNamingThePoint) {
  std::atomic<int> handler_calls{0};
  std::mutex mu;
  std::vector<std::string> handled;
  MeshOptions options{.name = "sup", .fanout = 2, .on_failure = [&](const MeshEvent& e) {
                        // Count only after recording, so a reader that sees the
                        // count also sees the point.
                        {
                          std::lock_guard<std::mutex> lock(mu);
                          handled.push_back(e.point.to_string());
                        }
                        handler_calls++;
                        return MeshFailureAction::kContinue;
                      }};
  ActorMesh<Worker> mesh = spawn(shape_2x4(), options);
  absl::Status st = mesh.call(SlowUnless{6}).get(absl::Seconds(20)).status();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("{hosts=1, gpus=2}"), std::string::npos) << st;

  // The mesh event reaches the handler (it may lag the failed call a little).
  for (int i = 0; i < 2000 && handler_calls.load() == 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(handler_calls.load(), 1);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(handled, std::vector<std::string>{"{hosts=1, gpus=2}"});
  }
  std::vector<MeshEvent> events = mesh.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_FALSE(events[0].reason.ok());
  EXPECT_NE(events[0].to_string().find("sup[6]"), std::string::npos) << events[0].to_string();

  // Continue on the survivors: a call that includes the dead point fails at
  // once naming it; slices without it work; cast and choose skip it.
  absl::Status again = mesh.call(WhoAmI{}).get(absl::Seconds(5)).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(again.message().find("{hosts=1, gpus=2}"), std::string::npos) << again;
  EXPECT_EQ(mesh.slice("hosts", 0)->call(WhoAmI{}).get(absl::Seconds(10))->values(),
            (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_TRUE(mesh.cast(Add{1}).ok());
  for (int i = 0; i < 20; ++i) EXPECT_NE(*mesh.choose(WhoAmI{}).get(absl::Seconds(10)), 6);
  EXPECT_EQ(mesh.slice({{"hosts", 1}, {"gpus", 2}})->choose(WhoAmI{}).get().status().code(),
            absl::StatusCode::kUnavailable);
  ReplyStream<int64_t> s = mesh.slice("hosts", 1)->stream(WhoAmI{});
  size_t errors = 0;
  for (size_t i = 0; i < s.size(); ++i) errors += s.next(absl::Seconds(10))->second.ok() ? 0 : 1;
  EXPECT_EQ(errors, 4u) << "a view with a dead member streams its error to every point";
}

TEST_F(ActorMeshTest, DefaultPolicyStopsTheMesh) {
  ActorMesh<Worker> mesh = spawn(shape_2x4(), {.name = "stopper"});
  absl::Status st = mesh.call(FailAt{3}).get(absl::Seconds(10)).status();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("{hosts=0, gpus=3}"), std::string::npos) << st;
  absl::Status later;
  for (int i = 0; i < 2000; ++i) {
    later = mesh.slice("hosts", 1)->call(WhoAmI{}).get(absl::Seconds(5)).status();
    if (later.code() == absl::StatusCode::kFailedPrecondition) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
  EXPECT_NE(later.message().find("stopped"), std::string::npos) << later;
  EXPECT_NE(later.message().find("{hosts=0, gpus=3}"), std::string::npos) << later;
  EXPECT_EQ(mesh.cast(Add{1}).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ActorMeshTest, ExplicitStopFailsLaterRequests) {
  ActorMesh<Worker> mesh = spawn(shape_2x4(), {.name = "stopped"});
  mesh.stop();
  EXPECT_EQ(mesh.call(WhoAmI{}).get(absl::Seconds(5)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(mesh.events().empty()) << "a stop we asked for is not a failure";
}

TEST_F(ActorMeshTest, SpawnErrors) {
  ActorMesh<Worker> first = spawn(shape_2x4(), {.name = "dup"});
  absl::StatusOr<ActorMesh<Worker>> second =
      ActorMesh<Worker>::Spawn(runtime_, shape_2x4(), {.name = "dup"}, std::string("w"));
  EXPECT_FALSE(second.ok());
  EXPECT_EQ(ActorMesh<Worker>::Spawn(runtime_, shape_2x4(), {.name = "zero", .fanout = 0}, std::string("w"))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // A mesh over existing actors needs one per point.
  EXPECT_EQ(ActorMesh<Worker>::Create(runtime_, shape_2x4(), first.refs(), {.name = "again"}).ok(), true);
  EXPECT_EQ(ActorMesh<Worker>::Create(runtime_, *Shape::Create({{"x", 3}}), first.refs(), {.name = "bad"})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The first mesh is unaffected by the failed spawn.
  EXPECT_EQ(first.call(WhoAmI{}).get(absl::Seconds(10))->values().size(), 8u);
}

}  // namespace
}  // namespace castmesh
