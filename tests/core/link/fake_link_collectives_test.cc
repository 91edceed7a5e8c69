// Every collective algorithm (core/collectives/algorithms.cc) over FakeLink
// (fake_link.h): ranks 2..5 of one communicator in this process, every
// message carried by the fake link in arrival order or each batch newest
// first, sizes on both sides of the small-message and two-rank thresholds;
// results against a serial reference. Then the link's gate (nothing moves
// until the test opens it), a failed send (the collective fails on every
// rank, naming it, instead of hanging), and a cancelled receive that a
// late message never writes.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "castmesh/reduction.h"
#include "core/collectives/algorithms.h"
#include "core/collectives/comm_group.h"
#include "core/link/fake_link.h"

namespace castmesh {
namespace {

using collectives::CollectiveCall;
using testing::FakeLink;

int64_t value(int rank, size_t i) { return rank * 1000 + static_cast<int64_t>(i % 977); }

// One communicator of `n` ranks in this process, all of whose messages go
// through one FakeLink.
class FakeMesh {
 public:
  FakeMesh(int n, FakeLink::Options options) : link_(std::make_shared<FakeLink>(options)) {
    static std::atomic<int> next_id{0};
    const std::string id = absl::StrCat("fake-link-comm-", next_id.fetch_add(1));
    std::vector<ProcId> procs;
    for (int r = 0; r < n; ++r) procs.push_back(absl::StrCat("fake-proc-", r));
    for (int r = 0; r < n; ++r) {
      detail::CommGroup::Layout layout;
      layout.id = id;
      layout.description = "communicator over FakeLink";
      layout.rank = r;
      layout.shape = *Shape::Create({{"rank", static_cast<size_t>(n)}});
      layout.procs = procs;
      layout.self_proc = "fake-self";  // no rank is "in this process": every message takes the link
      layout.test_link = link_;
      groups_.push_back(detail::CommGroup::Get(std::move(layout), /*pin=*/false));
    }
  }
  int size() const { return static_cast<int>(groups_.size()); }
  FakeLink& link() { return *link_; }
  detail::CommGroup& group(int r) { return *groups_[r]; }

  // Runs `body(rank, call)` on one thread per rank as one collective; a rank
  // that fails aborts the collective everywhere (as Communicator does).
  std::vector<absl::Status> run(const std::string& signature,
                                const std::function<absl::Status(int, const CollectiveCall&)>& body) {
    std::vector<absl::Status> results(groups_.size());
    std::vector<std::thread> threads;
    auto sig = std::make_shared<const std::string>(signature);
    for (int r = 0; r < size(); ++r) {
      threads.emplace_back([&, r] {
        const CollectiveCall call{groups_[r].get(), groups_[r]->next_sequence(), sig};
        results[r] = body(r, call);
        if (!results[r].ok()) groups_[r]->abort(call.sequence, results[r]);
      });
    }
    for (auto& t : threads) t.join();
    return results;
  }

 private:
  std::shared_ptr<FakeLink> link_;
  std::vector<std::shared_ptr<detail::CommGroup>> groups_;
};

Reduction sum64() { return *Reduction::Builtin(ReduceOp::kSum, DType::kInt64); }

void expect_all_ok(const std::vector<absl::Status>& results, const std::string& what) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].ok()) << what << " rank " << r << ": " << results[r];
  }
}

// Every collective at `count` int64 elements per block.
void run_every_collective(FakeMesh& mesh, size_t count) {
  const int n = mesh.size();
  const size_t bytes = count * sizeof(int64_t);
  const std::string at = absl::StrCat(" n=", n, " count=", count);
  std::vector<std::vector<int64_t>> in(n), out(n);
  auto fill = [&](size_t blocks) {
    for (int r = 0; r < n; ++r) {
      in[r].assign(count * blocks, 0);
      for (size_t i = 0; i < in[r].size(); ++i) in[r][i] = value(r, i);
      out[r].assign(count * blocks, -1);
    }
  };

  expect_all_ok(mesh.run("barrier", [&](int, const CollectiveCall& c) { return collectives::run_barrier(c); }),
                "barrier" + at);

  fill(1);
  for (int root : {0, n - 1}) {
    for (int r = 0; r < n; ++r) out[r] = r == root ? in[r] : std::vector<int64_t>(count, -1);
    expect_all_ok(mesh.run("broadcast", [&](int r, const CollectiveCall& c) {
      return collectives::run_broadcast(c, out[r].data(), bytes, root);
    }), "broadcast" + at);
    for (int r = 0; r < n; ++r) EXPECT_EQ(out[r], in[root]) << "broadcast root " << root << " rank " << r << at;
  }

  fill(1);
  std::vector<int64_t> sum(count, 0);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) sum[i] += in[r][i];
  }
  expect_all_ok(mesh.run("allreduce", [&](int r, const CollectiveCall& c) {
    return collectives::run_allreduce(c, in[r].data(), out[r].data(), count, sum64());
  }), "allreduce" + at);
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[r], sum) << "allreduce rank " << r << at;

  fill(1);
  expect_all_ok(mesh.run("allreduce-in-place", [&](int r, const CollectiveCall& c) {
    return collectives::run_allreduce(c, in[r].data(), in[r].data(), count, sum64());
  }), "allreduce in place" + at);
  for (int r = 0; r < n; ++r) EXPECT_EQ(in[r], sum) << "allreduce in place rank " << r << at;

  fill(1);
  const int root = n / 2;
  expect_all_ok(mesh.run("reduce", [&](int r, const CollectiveCall& c) {
    return collectives::run_reduce(c, in[r].data(), r == root ? out[r].data() : nullptr, count, sum64(), root);
  }), "reduce" + at);
  EXPECT_EQ(out[root], sum) << "reduce" << at;

  fill(1);
  std::vector<int64_t> gathered;
  for (int r = 0; r < n; ++r) gathered.insert(gathered.end(), in[r].begin(), in[r].end());
  std::vector<std::vector<int64_t>> all(n, std::vector<int64_t>(count * n, -1));
  expect_all_ok(mesh.run("allgather", [&](int r, const CollectiveCall& c) {
    return collectives::run_allgather(c, in[r].data(), all[r].data(), bytes);
  }), "allgather" + at);
  for (int r = 0; r < n; ++r) EXPECT_EQ(all[r], gathered) << "allgather rank " << r << at;

  for (auto& a : all) a.assign(count * n, -1);
  expect_all_ok(mesh.run("gather", [&](int r, const CollectiveCall& c) {
    return collectives::run_gather(c, in[r].data(), r == root ? all[r].data() : nullptr, bytes, root);
  }), "gather" + at);
  EXPECT_EQ(all[root], gathered) << "gather" << at;

  fill(static_cast<size_t>(n));  // in: n blocks per rank
  expect_all_ok(mesh.run("scatter", [&](int r, const CollectiveCall& c) {
    return collectives::run_scatter(c, in[r].data(), out[r].data(), bytes, root);
  }), "scatter" + at);
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(std::equal(out[r].begin(), out[r].begin() + count, in[root].begin() + r * count))
        << "scatter rank " << r << at;
  }

  fill(static_cast<size_t>(n));
  expect_all_ok(mesh.run("reduce_scatter", [&](int r, const CollectiveCall& c) {
    return collectives::run_reduce_scatter(c, in[r].data(), out[r].data(), count, sum64());
  }), "reduce_scatter" + at);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      int64_t want = 0;
      for (int s = 0; s < n; ++s) want += in[s][r * count + i];
      ASSERT_EQ(out[r][i], want) << "reduce_scatter rank " << r << " element " << i << at;
    }
  }

  fill(static_cast<size_t>(n));
  expect_all_ok(mesh.run("alltoall", [&](int r, const CollectiveCall& c) {
    return collectives::run_alltoall(c, in[r].data(), out[r].data(), bytes);
  }), "alltoall" + at);
  for (int r = 0; r < n; ++r) {
    for (int s = 0; s < n; ++s) {
      EXPECT_TRUE(std::equal(out[r].begin() + s * count, out[r].begin() + (s + 1) * count,
                             in[s].begin() + r * count))
          << "alltoall rank " << r << " block " << s << at;
    }
  }
}

struct Case {
  int ranks;
  FakeLink::Order order;
  bool read_at_delivery;
};

class FakeLinkCollectivesTest : public ::testing::TestWithParam<Case> {};

TEST_P(FakeLinkCollectivesTest, EveryCollectiveEverySize) {
  const Case c = GetParam();
  FakeMesh mesh(c.ranks, FakeLink::Options{c.order, false, 0, c.read_at_delivery});
  // 1 element; below the small-message threshold (64 KiB); above it (the
  // pipelined ring, at 2 ranks the exchange); above the two-rank exchange.
  for (size_t count : {size_t{1}, size_t{1000}, size_t{9000}, size_t{140000}}) {
    run_every_collective(mesh, count);
    if (HasFailure()) return;
  }
  EXPECT_EQ(mesh.link().failed(), 0u);
  EXPECT_GT(mesh.link().delivered(), 0u);
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (int n = 2; n <= 5; ++n) {
    all.push_back({n, FakeLink::Order::kFifo, false});
    all.push_back({n, FakeLink::Order::kReverse, false});
    all.push_back({n, FakeLink::Order::kReverse, true});
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Ranks, FakeLinkCollectivesTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.ranks, "ranks_",
                                               info.param.order == FakeLink::Order::kFifo ? "fifo" : "reverse",
                                               info.param.read_at_delivery ? "_held_buffers" : "");
                         });

// Nothing moves until the gate opens: no rank finishes an allreduce while
// its messages are held, and every rank does once they go.
TEST(FakeLinkGateTest, CollectiveWaitsForTheGate) {
  constexpr int n = 3;
  constexpr size_t count = 300;
  FakeMesh mesh(n, FakeLink::Options{FakeLink::Order::kFifo, /*gate_closed=*/true, 0, false});
  std::vector<std::vector<int64_t>> in(n, std::vector<int64_t>(count)), out(n, std::vector<int64_t>(count));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) in[r][i] = value(r, i);
  }
  std::atomic<int> finished{0};
  std::vector<absl::Status> results;
  std::thread ranks([&] {
    results = mesh.run("allreduce", [&](int r, const CollectiveCall& c) {
      absl::Status st = collectives::run_allreduce(c, in[r].data(), out[r].data(), count, sum64());
      finished.fetch_add(1);
      return st;
    });
  });
  // Recursive doubling at 3 ranks: rank 0 folds into rank 1 first, rank 2
  // sends to rank 1: two messages are held before anything can move.
  while (mesh.link().held() < 2) std::this_thread::yield();
  EXPECT_EQ(finished.load(), 0);
  EXPECT_EQ(mesh.link().delivered(), 0u);
  mesh.link().open();
  ranks.join();
  expect_all_ok(results, "allreduce after the gate opened");
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[r][i], value(0, i) + value(1, i) + value(2, i));
  }
}

// A send that fails fails the collective on every rank (the failing rank
// aborts it everywhere) instead of leaving a rank waiting for it.
TEST(FakeLinkFailureTest, FailedSendFailsEveryRank) {
  for (int n = 2; n <= 5; ++n) {
    for (uint64_t nth : {uint64_t{1}, uint64_t{3}}) {
      FakeMesh mesh(n, FakeLink::Options{FakeLink::Order::kFifo, false, nth, false});
      std::vector<std::vector<int64_t>> in(n, std::vector<int64_t>(64, 1)), out(n, std::vector<int64_t>(64));
      std::vector<absl::Status> results = mesh.run("allreduce", [&](int r, const CollectiveCall& c) {
        return collectives::run_allreduce(c, in[r].data(), out[r].data(), 64, sum64());
      });
      if (mesh.link().failed() == 0) continue;  // fewer sends than nth at this rank count
      int failed = 0, named = 0;
      for (const absl::Status& st : results) {
        failed += st.ok() ? 0 : 1;
        named += absl::StrContains(st.message(), "fail_nth") ? 1 : 0;
      }
      EXPECT_GE(failed, 1) << "n=" << n << " nth=" << nth;
      EXPECT_GE(named, 1) << "n=" << n << " nth=" << nth;
    }
  }
}

// A receive cancelled before its message arrives is never written: the
// late message goes to the unexpected queue instead.
TEST(FakeLinkNoLateBytesTest, CancelledReceiveStaysUntouched) {
  FakeMesh mesh(2, FakeLink::Options{FakeLink::Order::kFifo, /*gate_closed=*/true, 0, false});
  std::vector<char> landing(4096, 'x');
  auto recv = mesh.group(1).post_recv(collectives::Channel::kP2P, 0, 7, landing.data(), landing.size());
  const std::vector<char> payload(4096, 'y');
  auto sent = mesh.group(0).start_send(collectives::Channel::kP2P, 1, 7, payload.data(), payload.size());
  ASSERT_TRUE(mesh.group(1).mailbox().cancel(recv));
  mesh.link().open();
  while (mesh.link().delivered() < 1) std::this_thread::yield();
  EXPECT_EQ(landing, std::vector<char>(4096, 'x'));
  // The message waits, unexpected, for the next receive.
  std::vector<char> again(4096, 'x');
  auto second = mesh.group(1).post_recv(collectives::Channel::kP2P, 0, 7, again.data(), again.size());
  ASSERT_TRUE(second->wait(absl::Seconds(60)).ok());
  EXPECT_EQ(again, payload);
  EXPECT_TRUE(sent->wait(absl::Seconds(60)).ok());
}

}  // namespace
}  // namespace castmesh
