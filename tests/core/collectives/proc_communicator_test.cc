// Communicator across real worker procs (this binary re-executed): data
// moves through the procs' transport; a proc that dies fails every pending
// operation on the other ranks, naming the dead rank, instead of hanging.
#include <unistd.h>

#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "castmesh/actor_mesh.h"
#include "castmesh/communicator.h"
#include "castmesh/proc_mesh.h"

namespace {

// Which scenario a member runs (see Member::run).
struct Scenario {
  int64_t which = 0;
};
absl::Status encode_scenario(const Scenario& m, std::string* out) {
  *out = std::to_string(m.which);
  return absl::OkStatus();
}
absl::Status decode_scenario(std::string_view b, Scenario* m) {
  return absl::SimpleAtoi(absl::string_view(b.data(), b.size()), &m->which) ? absl::OkStatus()
                                                                           : absl::InvalidArgumentError("bad Scenario");
}

}  // namespace

CASTMESH_REGISTER_MESSAGE(Scenario, "castmesh.test.collectives.Scenario", encode_scenario, decode_scenario);

namespace {

using castmesh::Communicator;
using castmesh::DType;
using castmesh::ReduceOp;
using castmesh::TensorView;

constexpr int64_t kSums = 1;
constexpr int64_t kRankTwoDies = 2;

// Answers "OK v1,v2,..." or "ERR <status>".
class Member : public castmesh::Actor {
 public:
  std::string run(const Scenario& m) {
    absl::StatusOr<Communicator> comm = Communicator::current();
    if (!comm.ok()) return "ERR " + comm.status().ToString();
    std::vector<double> got;
    absl::Status st = m.which == kSums ? sums(*comm, got) : die_or_wait(*comm, got);
    if (!st.ok()) return "ERR " + st.ToString();
    return "OK " + absl::StrJoin(got, ",");
  }
  using Handlers = castmesh::Handlers<&Member::run>;

 private:
  static absl::Status sums(Communicator& c, std::vector<double>& got) {
    for (size_t count : {size_t{3}, size_t{300000}}) {  // recursive doubling, then the ring
      std::vector<int64_t> v(count);
      std::iota(v.begin(), v.end(), c.rank());
      TensorView t = TensorView::Contiguous(v.data(), DType::kInt64, {static_cast<int64_t>(count)});
      if (absl::Status st = c.allreduce(t, t, ReduceOp::kSum); !st.ok()) return st;
      got.push_back(static_cast<double>(v.back()));
    }
    int64_t token = c.rank() == 0 ? 77 : 0;
    if (absl::Status st = c.broadcast(TensorView::Contiguous(&token, DType::kInt64, {1}), 0); !st.ok()) return st;
    got.push_back(static_cast<double>(token));
    // A ring of point-to-point messages.
    int64_t mine = c.rank() * 10, from_left = -1;
    const int right = (c.rank() + 1) % c.size(), left = (c.rank() + c.size() - 1) % c.size();
    auto req = c.irecv(TensorView::Contiguous(&from_left, DType::kInt64, {1}), left, 5);
    if (absl::Status st = c.send(TensorView::Contiguous(&mine, DType::kInt64, {1}), right, 5); !st.ok()) return st;
    if (auto done = req.wait(absl::Seconds(30)); !done.ok()) return done.status();
    got.push_back(static_cast<double>(from_left));
    return absl::OkStatus();
  }
  // Rank 2's proc exits in the middle; the others wait in an allreduce.
  static absl::Status die_or_wait(Communicator& c, std::vector<double>& got) {
    if (c.rank() == 2) ::_exit(3);
    int64_t v = 1;
    return c.allreduce(TensorView::Contiguous(&v, DType::kInt64, {1}), TensorView::Contiguous(&v, DType::kInt64, {1}),
                       ReduceOp::kSum);
  }
};

}  // namespace

CASTMESH_REGISTER_ACTOR(Member);

namespace {

TEST(ProcCommunicator, CollectivesAndPointToPointAcrossProcs) {
  castmesh::Runtime runtime;
  auto procs = castmesh::LocalAllocator().allocate(runtime, 3);
  ASSERT_TRUE(procs.ok()) << procs.status();
  auto mesh = castmesh::ActorMesh<Member>::Spawn(*procs, castmesh::MeshOptions{.name = "member"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto replies = mesh->call(Scenario{kSums}).get(absl::Seconds(60));
  ASSERT_TRUE(replies.ok()) << replies.status();
  const int64_t n = 300000;
  for (int r = 0; r < 3; ++r) {
    // last element: sum over ranks of (rank + count - 1)
    EXPECT_EQ(replies->values()[r],
              absl::StrCat("OK ", 3 * 2 + 3, ",", 3 * (n - 1) + 3, ",77,", ((r + 2) % 3) * 10))
        << "rank " << r;
  }
  EXPECT_TRUE(procs->stop().ok());
}

TEST(ProcCommunicator, DeadRankFailsThePendingCollectiveOnTheOthers) {
  castmesh::Runtime runtime;
  auto procs = castmesh::LocalAllocator().allocate(runtime, 4);
  ASSERT_TRUE(procs.ok()) << procs.status();
  castmesh::MeshOptions options{.name = "member"};
  options.on_failure = [](const castmesh::MeshEvent&) { return castmesh::MeshFailureAction::kContinue; };
  auto mesh = castmesh::ActorMesh<Member>::Spawn(*procs, options);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const absl::Time start = absl::Now();
  auto stream = mesh->stream(Scenario{kRankTwoDies});
  int answered = 0;
  for (size_t i = 0; i < 4; ++i) {
    auto next = stream.next(absl::Seconds(30));
    ASSERT_TRUE(next.ok()) << next.status();
    const auto& [point, reply] = *next;
    if (point.rank() == 2) {
      EXPECT_FALSE(reply.ok());  // its proc died
      continue;
    }
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_NE(reply->find("ERR"), std::string::npos) << *reply;
    EXPECT_NE(reply->find("rank 2"), std::string::npos) << *reply;
    ++answered;
  }
  EXPECT_EQ(answered, 3);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));  // generous: no hang
  (void)procs->stop();
}

}  // namespace
