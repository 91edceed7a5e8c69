// Communicator across real worker procs (this binary re-executed): data
// moves through the procs' transport; a proc that dies fails every pending
// operation on the other ranks, naming the dead rank, instead of hanging.
#include <unistd.h>

#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"
#include "castmesh/communicator.h"
#include "core/testing/worker_procs.h"

namespace {

using castmesh::Communicator;
using castmesh::DType;
using castmesh::ReduceOp;
using castmesh::TensorView;

// The scenarios of these tests (registered below by name).
struct ProcScenarios {
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

[[maybe_unused]] const bool registered = castmesh::testing::register_proc_scenarios({
    {"proc_communicator.sums", castmesh::testing::joined(ProcScenarios::sums)},
    {"proc_communicator.rank_two_dies", castmesh::testing::joined(ProcScenarios::die_or_wait)},
});

TEST(ProcCommunicator, CollectivesAndPointToPointAcrossProcs) {
  auto replies = castmesh::testing::run_on_worker_procs(3, "proc_communicator.sums", absl::Seconds(60));
  ASSERT_EQ(replies.size(), 3u);
  const int64_t n = 300000;
  for (int r = 0; r < 3; ++r) {
    // last element: sum over ranks of (rank + count - 1)
    EXPECT_EQ(replies[r], absl::StrCat("OK ", 3 * 2 + 3, ",", 3 * (n - 1) + 3, ",77,", ((r + 2) % 3) * 10))
        << "rank " << r;
  }
}

TEST(ProcCommunicator, DeadRankFailsThePendingCollectiveOnTheOthers) {
  castmesh::testing::WorkerProcs procs(4, {.continue_on_failure = true});
  ASSERT_TRUE(procs.ok());
  const absl::Time start = absl::Now();
  const int answered = procs.run_with_dead_rank(
      "proc_communicator.rank_two_dies", 2, absl::Seconds(30),
      [](int rank, const std::string& reply) { castmesh::testing::expect_error_naming(reply, "rank 2", rank); });
  EXPECT_EQ(answered, 3);
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));  // generous: no hang
}

}  // namespace
