// Communicator across real worker procs (this binary re-executed): data
// moves through the procs' transport; a proc that dies fails every pending
// operation on the other ranks, naming the dead rank, instead of hanging.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <string>
#include <thread>

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
  // Small messages, each of which a waiting caller may read from its
  // socket itself: allreduces checked one by one, then rank 0 receives
  // from any source (each source's messages in the order sent) and by tag
  // out of order.
  static absl::Status small_messages(Communicator& c, std::vector<double>& got) {
    for (int i = 0; i < 2000; ++i) {
      int64_t v[3] = {c.rank() + i, 1, -c.rank()};
      TensorView t = TensorView::Contiguous(v, DType::kInt64, {3});
      if (absl::Status st = c.allreduce(t, t, ReduceOp::kSum); !st.ok()) return st;
      const int64_t n = c.size();
      if (v[0] != n * (n - 1) / 2 + n * i || v[1] != n || v[2] != -n * (n - 1) / 2) {
        return absl::InternalError(absl::StrCat("allreduce ", i, " gave ", v[0], ",", v[1], ",", v[2]));
      }
    }
    constexpr int kEach = 300;
    if (c.rank() == 0) {
      std::vector<int64_t> next(c.size(), 0);
      for (int i = 0; i < kEach * (c.size() - 1); ++i) {
        int64_t x = -1;
        auto status = c.recv(TensorView::Contiguous(&x, DType::kInt64, {1}), castmesh::kAnySource, 7);
        if (!status.ok()) return status.status();
        if (x != next[status->source]++) {
          return absl::InternalError(absl::StrCat("from rank ", status->source, " got ", x, " out of order"));
        }
      }
      int64_t second = 0, first = 0;  // rank 1 sent tag 1, then tag 2
      if (auto st = c.recv(TensorView::Contiguous(&second, DType::kInt64, {1}), 1, 2); !st.ok()) return st.status();
      if (auto st = c.recv(TensorView::Contiguous(&first, DType::kInt64, {1}), 1, 1); !st.ok()) return st.status();
      got.push_back(static_cast<double>(first));
      got.push_back(static_cast<double>(second));
    } else {
      for (int64_t i = 0; i < kEach; ++i) {
        if (absl::Status st = c.send(TensorView::Contiguous(&i, DType::kInt64, {1}), 0, 7); !st.ok()) return st;
      }
      if (c.rank() == 1) {
        int64_t first = 11, second = 22;
        if (absl::Status st = c.send(TensorView::Contiguous(&first, DType::kInt64, {1}), 0, 1); !st.ok()) return st;
        if (absl::Status st = c.send(TensorView::Contiguous(&second, DType::kInt64, {1}), 0, 2); !st.ok()) return st;
      }
    }
    return c.barrier();
  }
  // Rank 2's proc SIGKILLs itself from another thread while every rank runs
  // small allreduces back to back; the others must fail naming rank 2.
  static absl::Status killed_small(Communicator& c, std::vector<double>&) {
    if (c.rank() == 2) {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        ::kill(::getpid(), SIGKILL);
      }).detach();
    }
    for (int i = 0; i < 10000000; ++i) {
      int64_t v = 1;
      TensorView t = TensorView::Contiguous(&v, DType::kInt64, {1});
      if (absl::Status st = c.allreduce(t, t, ReduceOp::kSum); !st.ok()) return st;
    }
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
    {"proc_communicator.small_messages", castmesh::testing::joined(ProcScenarios::small_messages)},
    {"proc_communicator.rank_two_killed_small", castmesh::testing::joined(ProcScenarios::killed_small)},
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

// Over the procs' sockets (as between hosts): small messages, which the
// waiting caller reads from its socket itself (core/collectives/socket_wait.h).
const castmesh::testing::WorkerProcsOptions kOverSockets{
    .env = {{"CASTMESH_SHM", "0"}, {"CASTMESH_SINGLE_COPY", "0"}}};

TEST(ProcCommunicator, SmallMessagesOverSocketsKeepOrderAndTags) {
  auto replies =
      castmesh::testing::run_on_worker_procs(3, "proc_communicator.small_messages", absl::Seconds(90), kOverSockets);
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_EQ(replies[0], "OK 11,22");
  EXPECT_EQ(replies[1], "OK");
  EXPECT_EQ(replies[2], "OK");
}

TEST(ProcCommunicator, RankKilledMidSmallAllreducesOverSocketsFailsTheOthersNamingIt) {
  castmesh::testing::WorkerProcsOptions options = kOverSockets;
  options.continue_on_failure = true;
  castmesh::testing::WorkerProcs procs(3, options);
  ASSERT_TRUE(procs.ok());
  const int answered = procs.run_with_dead_rank(
      "proc_communicator.rank_two_killed_small", 2, absl::Seconds(60),  // a bound against a hang
      [](int rank, const std::string& reply) { castmesh::testing::expect_error_naming(reply, "rank 2", rank); });
  EXPECT_EQ(answered, 2);
}

}  // namespace
