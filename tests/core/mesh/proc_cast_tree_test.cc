// The per-proc cast tree: meshes whose members live in real worker procs
// (this test binary re-executed; castmesh::init in main() makes them
// workers), several members per proc. Checks what the controller sends
// (its ProcHost's message counter and its relay's hop counter), ordering,
// replies per point, reductions folded by the relays, and procs killed
// while a call is in flight.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "castmesh/actor_mesh.h"
#include "castmesh/proc_mesh.h"
#include "core/mesh/cast_relay.h"
#include "core/proc/proc_host.h"
#include "core/testing/digits_actor.h"

namespace {

// Not commutative, associative: concatenates decimal digit strings as
// numbers (a followed by b), for values below 10 per member.
int64_t append_digits(int64_t a, int64_t b) {
  int64_t scale = 10;
  while (scale <= b) scale *= 10;
  return a * scale + b;
}

}  // namespace

CASTMESH_REGISTER_REDUCER(int64_t, "append_digits", append_digits);

namespace {

using castmesh::ActorMesh;
using castmesh::ActorRef;
using castmesh::MeshEvent;
using castmesh::MeshFailureAction;
using castmesh::MeshOptions;
using castmesh::Shape;

constexpr int kProcs = 4;
constexpr size_t kPerProc = 3;

// A {procs=4, local=3} mesh: member (p, j) is the j-th actor spawned on
// proc p, so each proc holds one contiguous run of ranks.
absl::StatusOr<ActorMesh<Digits>> spawn_blocks(castmesh::Runtime& runtime, const castmesh::ProcMesh& procs,
                                              const std::string& name, size_t fanout) {
  std::vector<std::vector<ActorRef<Digits>>> spawned;
  for (size_t j = 0; j < kPerProc; ++j) {
    auto refs = procs.spawn<Digits>(name + "_" + std::to_string(j));
    if (!refs.ok()) return refs.status();
    spawned.push_back(*refs);
  }
  std::vector<ActorRef<Digits>> members;
  for (size_t p = 0; p < procs.size(); ++p) {
    for (size_t j = 0; j < kPerProc; ++j) members.push_back(spawned[j][p]);
  }
  MeshOptions options;
  options.name = name;
  options.fanout = fanout;
  options.on_failure = [](const MeshEvent&) { return MeshFailureAction::kContinue; };
  return ActorMesh<Digits>::Create(
      runtime, *Shape::Create({{"procs", procs.size()}, {"local", kPerProc}}), members, options);
}

class ProcCastTree : public ::testing::Test {
 protected:
  void SetUp() override {
    auto allocated = castmesh::LocalAllocator().allocate(runtime_, kProcs);
    ASSERT_TRUE(allocated.ok()) << allocated.status();
    procs_ = *std::move(allocated);
    host_ = castmesh::proc::ProcHost::of(runtime_);
    ASSERT_NE(host_, nullptr);
  }
  void TearDown() override { EXPECT_TRUE(procs_.stop().ok()); }

  castmesh::Runtime runtime_;
  castmesh::ProcMesh procs_;
  std::shared_ptr<castmesh::proc::ProcHost> host_;
};

TEST_F(ProcCastTree, ControllerSendsFanoutMessagesPerCast) {
  auto mesh = spawn_blocks(runtime_, procs_, "count", /*fanout=*/2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ASSERT_TRUE(mesh->call(Get{}).get(absl::Seconds(20)).ok());  // connections are up

  constexpr int kCasts = 10;
  const uint64_t sent_before = host_->messages_sent();
  const uint64_t hops_before = castmesh::mesh::CastRelay::of(*host_)->hops_sent();
  for (int i = 0; i < kCasts; ++i) ASSERT_TRUE(mesh->cast(Add{1}).ok());
  const uint64_t sent = host_->messages_sent() - sent_before;
  const uint64_t hops = castmesh::mesh::CastRelay::of(*host_)->hops_sent() - hops_before;
  // 4 procs, fan-out 2: the controller sends to 2 procs per cast, whatever
  // the 12 members; the procs forward the rest.
  EXPECT_EQ(hops, 2u * kCasts);
  EXPECT_LE(sent, 2u * kCasts) << "the controller sent other messages during the casts";
  EXPECT_GE(sent, 2u * kCasts);

  // Every member got every cast, once.
  auto values = mesh->call(Get{}).get(absl::Seconds(20));
  ASSERT_TRUE(values.ok()) << values.status();
  for (const auto& [point, v] : values->items()) EXPECT_EQ(v, 1111111111) << point;

  // Direct fan-out: one message per proc, still not one per member. (Order
  // holds per fan-out: the call below uses the same one.)
  auto direct = mesh->with_fanout(100);
  const uint64_t direct_before = host_->messages_sent();
  ASSERT_TRUE(direct.cast(Add{2}).ok());
  EXPECT_EQ(host_->messages_sent() - direct_before, static_cast<uint64_t>(kProcs));
  values = direct.call(Get{}).get(absl::Seconds(20));
  ASSERT_TRUE(values.ok()) << values.status();
  for (const auto& [point, v] : values->items()) EXPECT_EQ(v, 11111111112) << point;
}

TEST_F(ProcCastTree, CastsArriveInOrderAndCallsAnswerPerPoint) {
  auto mesh = spawn_blocks(runtime_, procs_, "order", /*fanout=*/2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  // Mixed targets: the whole mesh, a column, a row, a strided slice.
  ASSERT_TRUE(mesh->cast(Add{1}).ok());
  ASSERT_TRUE(mesh->slice("local", 1)->cast(Add{2}).ok());
  ASSERT_TRUE(mesh->slice("procs", 2)->cast(Add{3}).ok());
  ASSERT_TRUE(mesh->slice("procs", castmesh::Range(1, 4, 2))->cast(Add{4}).ok());
  ASSERT_TRUE(mesh->cast(Add{5}).ok());

  auto values = mesh->call(Get{}).get(absl::Seconds(20));
  ASSERT_TRUE(values.ok()) << values.status();
  auto pids = mesh->call(Pid{}).get(absl::Seconds(20));
  ASSERT_TRUE(pids.ok()) << pids.status();
  ASSERT_EQ(values->size(), static_cast<size_t>(kProcs) * kPerProc);
  for (const auto& [point, v] : values->items()) {
    const size_t p = point.coords()[0];
    const size_t j = point.coords()[1];
    int64_t expected = 1;
    if (j == 1) expected = expected * 10 + 2;
    if (p == 2) expected = expected * 10 + 3;
    if (p == 1 || p == 3) expected = expected * 10 + 4;
    expected = expected * 10 + 5;
    EXPECT_EQ(v, expected) << point;
    EXPECT_EQ((*pids)[point], procs_.proc(p).pid) << point;
  }

  // A sliced call answers with the slice's points.
  auto column = mesh->slice("local", 1)->call(Get{}).get(absl::Seconds(20));
  ASSERT_TRUE(column.ok()) << column.status();
  EXPECT_EQ(column->values(), (std::vector<int64_t>{125, 1245, 1235, 1245}));

  // Streams give one reply per point.
  auto stream = mesh->slice("procs", 0)->stream(Get{});
  std::vector<int64_t> streamed(kPerProc, -1);
  for (size_t i = 0; i < kPerProc; ++i) {
    auto r = stream.next(absl::Seconds(20));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->second.ok()) << r->second.status();
    streamed[r->first.position()] = *r->second;
  }
  EXPECT_EQ(streamed, (std::vector<int64_t>{15, 125, 15}));
}

TEST_F(ProcCastTree, ReductionsFoldAcrossProcsInRowMajorOrder) {
  auto mesh = spawn_blocks(runtime_, procs_, "reduce", /*fanout=*/2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  // Member (p, j) holds the digit 3p+j+1 (1..9, then 10..12 as two digits).
  for (int p = 0; p < kProcs; ++p) {
    for (size_t j = 0; j < kPerProc; ++j) {
      auto one = mesh->slice({{"procs", static_cast<int64_t>(p)}, {"local", static_cast<int64_t>(j)}});
      ASSERT_TRUE(one.ok());
      ASSERT_TRUE(one->cast(Add{static_cast<int64_t>(3 * p + j + 1)}).ok());
    }
  }
  auto& relay = *castmesh::mesh::CastRelay::of(*host_);

  // A registered reducer: the relays fold; the controller receives one
  // folded value per child of the root (2).
  uint64_t pieces_before = relay.pieces_received();
  auto sum = mesh->call(Get{}, castmesh::reducers::sum<int64_t>()).get(absl::Seconds(20));
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, 78);
  EXPECT_EQ(relay.pieces_received() - pieces_before, 2u);

  // Row-major order with a non-commutative registered reducer.
  auto digits = castmesh::reducers::registered<int64_t>("append_digits");
  ASSERT_TRUE(digits.ok()) << digits.status();
  pieces_before = relay.pieces_received();
  auto appended = mesh->call(Get{}, *digits).get(absl::Seconds(20));
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(*appended, 123456789101112);
  EXPECT_EQ(relay.pieces_received() - pieces_before, 2u);

  // The same on a strided slice: procs 1 and 3.
  auto odd = mesh->slice("procs", castmesh::Range(1, 4, 2));
  ASSERT_TRUE(odd.ok());
  auto odd_appended = odd->call(Get{}, *digits).get(absl::Seconds(20));
  ASSERT_TRUE(odd_appended.ok()) << odd_appended.status();
  EXPECT_EQ(*odd_appended, 456101112);

  // An unregistered reducer (a lambda) folds at the controller: every reply
  // comes up unfolded, the result is the same.
  pieces_before = relay.pieces_received();
  auto lambda = mesh->call(Get{}, castmesh::reducers::custom<int64_t>("append", append_digits))
                    .get(absl::Seconds(20));
  ASSERT_TRUE(lambda.ok()) << lambda.status();
  EXPECT_EQ(*lambda, 123456789101112);
  EXPECT_EQ(relay.pieces_received() - pieces_before, static_cast<uint64_t>(kProcs) * kPerProc);
}

TEST_F(ProcCastTree, MembersSpreadRoundRobinAreFoldedByTheCaller) {
  // Rank r lives on proc r % 4: a proc's members are not one run of ranks,
  // so no relay may fold (it would not be row-major order); the values come
  // up unfolded and the caller folds them in order.
  std::vector<std::vector<ActorRef<Digits>>> spawned;
  for (size_t j = 0; j < 2; ++j) {
    auto refs = procs_.spawn<Digits>("spread_" + std::to_string(j));
    ASSERT_TRUE(refs.ok()) << refs.status();
    spawned.push_back(*refs);
  }
  std::vector<ActorRef<Digits>> members;
  for (size_t j = 0; j < 2; ++j) {
    for (size_t p = 0; p < static_cast<size_t>(kProcs); ++p) members.push_back(spawned[j][p]);
  }
  MeshOptions options;
  options.name = "spread";
  options.fanout = 2;
  auto mesh = ActorMesh<Digits>::Create(runtime_, *Shape::Create({{"x", members.size()}}), members, options);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  for (size_t r = 0; r < members.size(); ++r) {
    ASSERT_TRUE(mesh->slice("x", static_cast<int64_t>(r))->cast(Add{static_cast<int64_t>(r + 1)}).ok());
  }
  auto& relay = *castmesh::mesh::CastRelay::of(*host_);
  const uint64_t pieces_before = relay.pieces_received();
  auto appended = mesh->call(Get{}, *castmesh::reducers::registered<int64_t>("append_digits"))
                      .get(absl::Seconds(20));
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(*appended, 12345678);
  EXPECT_EQ(relay.pieces_received() - pieces_before, members.size());
  auto pids = mesh->call(Pid{}).get(absl::Seconds(20));
  ASSERT_TRUE(pids.ok()) << pids.status();
  for (size_t r = 0; r < members.size(); ++r) EXPECT_EQ(pids->values()[r], procs_.proc(r % kProcs).pid) << r;
}

TEST_F(ProcCastTree, MembersInTheCallersOwnProcAreAGroupToo) {
  // Rank 0 lives in the controller, ranks 1..4 in the workers: the
  // controller's relay is the first node of the tree.
  auto local = runtime_.spawn_with<Digits>(castmesh::SpawnOptions{.name = "mixed_local"});
  ASSERT_TRUE(local.ok()) << local.status();
  auto remote = procs_.spawn<Digits>("mixed");
  ASSERT_TRUE(remote.ok()) << remote.status();
  std::vector<ActorRef<Digits>> members{*local};
  members.insert(members.end(), remote->begin(), remote->end());
  MeshOptions options;
  options.name = "mixed";
  options.fanout = 2;
  auto mesh = ActorMesh<Digits>::Create(runtime_, *Shape::Create({{"x", members.size()}}), members, options);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ASSERT_TRUE(mesh->cast(Add{1}).ok());
  ASSERT_TRUE(mesh->slice("x", castmesh::Range(0, 5, 2))->cast(Add{2}).ok());
  ASSERT_TRUE(mesh->cast(Add{3}).ok());
  auto values = mesh->call(Get{}).get(absl::Seconds(20));
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(values->values(), (std::vector<int64_t>{123, 13, 123, 13, 123}));
  auto pids = mesh->call(Pid{}).get(absl::Seconds(20));
  ASSERT_TRUE(pids.ok()) << pids.status();
  EXPECT_EQ(pids->values()[0], static_cast<int64_t>(::getpid()));
  EXPECT_EQ(pids->values()[4], procs_.proc(3).pid);
  auto sum = mesh->call(Get{}, castmesh::reducers::sum<int64_t>()).get(absl::Seconds(20));
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, 3 * 123 + 2 * 13);
}

TEST_F(ProcCastTree, ProcsKilledDuringACallFailItNamingThePoint) {
  // Fan-out 1: a chain controller -> proc 0 -> 1 -> 2 -> 3, so proc 1 is a
  // forwarder for procs 2 and 3.
  auto mesh = spawn_blocks(runtime_, procs_, "chain", /*fanout=*/1);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ASSERT_TRUE(mesh->call(Get{}).get(absl::Seconds(20)).ok());

  // Every member naps, so the call is in flight when proc 1 dies.
  auto pending = mesh->call(Nap{300});
  auto reduce_pending = mesh->call(Nap{300}, castmesh::reducers::sum<int64_t>());
  ASSERT_EQ(::kill(static_cast<pid_t>(procs_.proc(1).pid), SIGKILL), 0);
  absl::Status st = pending.get(absl::Seconds(20)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("{procs=1, local="), std::string::npos) << st;
  // Every member of the dead proc is named (and those behind it, whose
  // replies had to pass through it, unless the hop was routed around it).
  EXPECT_NE(st.message().find("also failed"), std::string::npos) << st;
  EXPECT_NE(st.message().find("{procs=1, local=2}"), std::string::npos) << st;
  absl::Status reduce_st = reduce_pending.get(absl::Seconds(20)).status();
  EXPECT_EQ(reduce_st.code(), absl::StatusCode::kUnavailable) << reduce_st;
  EXPECT_NE(reduce_st.message().find("{procs=1, local="), std::string::npos) << reduce_st;

  // Once the mesh knows, a call including proc 1 fails at once naming its
  // points; the survivors behind it (procs 2 and 3) are routed around it.
  for (int i = 0; i < 5000 && mesh->events().size() < kPerProc; ++i) absl::SleepFor(absl::Milliseconds(1));
  absl::Status again = mesh->call(Get{}).get(absl::Seconds(20)).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kUnavailable) << again;
  EXPECT_NE(again.message().find("{procs=1, local=2}"), std::string::npos) << again;
  auto behind = mesh->slice("procs", castmesh::Range(2, 4))->call(Get{}).get(absl::Seconds(20));
  ASSERT_TRUE(behind.ok()) << behind.status();
  EXPECT_EQ(behind->size(), 2 * kPerProc);
  ASSERT_TRUE(mesh->slice("procs", castmesh::Range(2, 4))->cast(Add{7}).ok());
  auto sum = mesh->slice("procs", castmesh::Range(2, 4))->call(Get{}, castmesh::reducers::sum<int64_t>())
                 .get(absl::Seconds(20));
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, 7 * 2 * static_cast<int64_t>(kPerProc));
}

}  // namespace
