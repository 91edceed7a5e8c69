// Communicator over the members of an in-process actor mesh: every
// collective against a reference computed here, bit-identical reductions,
// rank order for non-commutative ops, point-to-point matching rules,
// along/split/dup, non-blocking calls, and the errors (mismatched
// collective, bad arguments, device buffers).
#include "castmesh/communicator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "castmesh/actor_mesh.h"
#include "castmesh/backend.h"
#include "core/collectives/exchange.h"
#include "core/testing/scenario_mesh.h"

namespace castmesh {
namespace {

using Outcome = testing::ScenarioOutcome<double>;
using Scenario = testing::ScenarioFn<double>;
Outcome fail(const absl::Status& st) { return testing::scenario_error<double>(st); }

template <typename T>
std::vector<double> as_doubles(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

class CommunicatorTest : public testing::ScenarioMeshTest<double> {
 protected:
  // Members run blocking collectives on pooled workers: more workers than
  // the largest mesh (6), so the mesh's forwarders always find one free
  // (docs/collectives.md, "Progress and threads").
  CommunicatorTest() : ScenarioMeshTest("member", 10) {}
};

void expect_ok(const std::vector<Outcome>& outcomes) {
  for (size_t r = 0; r < outcomes.size(); ++r) EXPECT_EQ(outcomes[r].error, "") << "rank " << r;
}

TEST_F(CommunicatorTest, RankSizeAndCurrentOutsideAMesh) {
  auto outcomes = run(3, [](Communicator& c) { return Outcome{"", {double(c.rank()), double(c.size())}}; });
  ASSERT_EQ(outcomes.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(outcomes[r].values, (std::vector<double>{double(r), 3}));
  EXPECT_EQ(Communicator::current().status().code(), absl::StatusCode::kFailedPrecondition);
}

// Small (recursive doubling) and large (ring) sums, on non-powers of two
// too; every rank gets the same bits.
TEST_F(CommunicatorTest, AllreduceSmallAndLargeMatchReferenceOnEveryRank) {
  for (int n : {1, 2, 3, 5}) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{100000}}) {
      auto outcomes = run(n, [count](Communicator& c) {
        std::vector<float> data(count);
        for (size_t i = 0; i < count; ++i) data[i] = 0.1f * static_cast<float>(c.rank() + 1) + static_cast<float>(i % 13);
        TensorView t = TensorView::Contiguous(data.data(), DType::kFloat32, {static_cast<int64_t>(count)});
        if (absl::Status st = c.allreduce(t, t, ReduceOp::kSum); !st.ok()) return fail(st);
        return Outcome{"", as_doubles(data)};
      });
      ASSERT_EQ(outcomes.size(), static_cast<size_t>(n));
      expect_ok(outcomes);
      for (size_t i = 0; i < count; i += 997) {
        double want = 0;
        for (int r = 0; r < n; ++r) want += 0.1 * (r + 1) + static_cast<double>(i % 13);
        EXPECT_NEAR(outcomes[0].values[i], want, 1e-3) << "n=" << n << " i=" << i;
      }
      for (int r = 1; r < n; ++r) EXPECT_EQ(outcomes[r].values, outcomes[0].values) << "rank " << r << " differs";
    }
  }
}

// More blocking members than workers: the members that wait in the
// allreduce hold both workers, and the scheduler's helper threads run the
// others (without them this mesh never finishes: the call times out).
TEST(CommunicatorBlocking, MoreBlockingMembersThanWorkersComplete) {
  Runtime runtime(RuntimeOptions{.workers = 2});
  auto mesh = ActorMesh<testing::ScenarioMember<double>>::Spawn(runtime, *Shape::Create({{"ranks", size_t{6}}}),
                                       MeshOptions{.name = "crowded"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  for (int round = 0; round < 3; ++round) {
    auto values = mesh->call(testing::RunScenario<double>{[](Communicator& c) {
                   int64_t v = c.rank() + 1;
                   TensorView t = TensorView::Contiguous(&v, DType::kInt64, {1});
                   if (absl::Status st = c.allreduce(t, t, ReduceOp::kSum); !st.ok()) return fail(st);
                   if (absl::Status st = c.barrier(); !st.ok()) return fail(st);
                   return Outcome{"", {double(v)}};
                 }})
                      .get(absl::Seconds(60));
    ASSERT_TRUE(values.ok()) << values.status();
    for (const Outcome& o : values->values()) EXPECT_EQ(o.values, std::vector<double>{21}) << o.error;
  }
  mesh->stop();
}

TEST_F(CommunicatorTest, EveryBuiltinOpAndAvg) {
  auto outcomes = run(4, [](Communicator& c) {
    std::vector<double> got;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kBand,
                        ReduceOp::kBor, ReduceOp::kBxor, ReduceOp::kLand, ReduceOp::kLor, ReduceOp::kLxor}) {
      int32_t v = c.rank() + 1, out = 0;
      absl::Status st = c.allreduce(TensorView::Contiguous(&v, DType::kInt32, {1}),
                                    TensorView::Contiguous(&out, DType::kInt32, {1}), op);
      if (!st.ok()) return fail(st);
      got.push_back(out);
    }
    double x = c.rank(), avg = 0;
    absl::Status st = c.allreduce(TensorView::Contiguous(&x, DType::kFloat64, {1}),
                                  TensorView::Contiguous(&avg, DType::kFloat64, {1}), ReduceOp::kAvg);
    if (!st.ok()) return fail(st);
    got.push_back(avg);
    return Outcome{"", got};
  });
  ASSERT_EQ(outcomes.size(), 4u);
  expect_ok(outcomes);
  // ranks contribute 1, 2, 3, 4
  EXPECT_EQ(outcomes[3].values, (std::vector<double>{10, 24, 1, 4, 0, 7, 4, 1, 1, 0, 1.5}));
}

// A non-commutative op sees ranks in order: "append the digit" gives 1234.
TEST_F(CommunicatorTest, NonCommutativeCustomOpKeepsRankOrder) {
  CustomReduceOp append{"append", [](const void* in, void* inout, size_t count, DType) {
                          auto* a = static_cast<const int64_t*>(in);
                          auto* b = static_cast<int64_t*>(inout);
                          for (size_t i = 0; i < count; ++i) {
                            int64_t scale = 1;
                            while (scale <= b[i]) scale *= 10;
                            b[i] = a[i] * scale + b[i];
                          }
                        },
                        /*commutative=*/false};
  for (int n : {3, 4}) {
    auto outcomes = run(n, [append](Communicator& c) {
      int64_t v = c.rank() + 1, all = 0, root_only = 0;
      if (absl::Status st = c.allreduce(TensorView::Contiguous(&v, DType::kInt64, {1}),
                                        TensorView::Contiguous(&all, DType::kInt64, {1}), append);
          !st.ok())
        return fail(st);
      if (absl::Status st = c.reduce(TensorView::Contiguous(&v, DType::kInt64, {1}),
                                     TensorView::Contiguous(&root_only, DType::kInt64, {1}), append, 1);
          !st.ok())
        return fail(st);
      return Outcome{"", {double(all), double(root_only)}};
    });
    ASSERT_EQ(outcomes.size(), static_cast<size_t>(n));
    expect_ok(outcomes);
    const double want = n == 3 ? 123 : 1234;
    for (int r = 0; r < n; ++r) ASSERT_EQ(outcomes[r].values.size(), 2u) << "rank " << r;
    for (int r = 0; r < n; ++r) EXPECT_EQ(outcomes[r].values[0], want);
    EXPECT_EQ(outcomes[1].values[1], want);
    EXPECT_EQ(outcomes[0].values[1], 0);  // only the root's output is written
  }
}

TEST_F(CommunicatorTest, BroadcastGatherScatterAllgatherAlltoallReduceScatter) {
  constexpr int n = 3;
  for (size_t block : {size_t{2}, size_t{200000}}) {  // small, and large enough for the pipelined chain
    auto outcomes = run(n, [block](Communicator& c) {
      const int r = c.rank();
      std::vector<double> got;
      auto view = [](std::vector<int32_t>& v) {
        return TensorView::Contiguous(v.data(), DType::kInt32, {static_cast<int64_t>(v.size())});
      };
      std::vector<int32_t> b(block, r == 1 ? 42 : 0);
      if (absl::Status st = c.broadcast(view(b), 1); !st.ok()) return fail(st);
      got.push_back(b.front() + b.back());
      std::vector<int32_t> mine(block, r), all(block * n, -1);
      if (absl::Status st = c.allgather(view(mine), view(all)); !st.ok()) return fail(st);
      got.push_back(all[0] + all[block] * 10 + all[2 * block] * 100);
      std::vector<int32_t> gathered(block * n, -1);
      if (absl::Status st = c.gather(view(mine), view(gathered), 2); !st.ok()) return fail(st);
      got.push_back(r == 2 ? gathered[block * 2 - 1] + gathered[block * 3 - 1] * 10 : -1);
      std::vector<int32_t> source(block * n), piece(block, -1);
      for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<int32_t>(i / block) * 7;
      if (absl::Status st = c.scatter(view(source), view(piece), 0); !st.ok()) return fail(st);
      got.push_back(piece.back());
      std::vector<int32_t> to_all(block * n), from_all(block * n, -1);
      for (size_t i = 0; i < to_all.size(); ++i) to_all[i] = r * 10 + static_cast<int32_t>(i / block);
      if (absl::Status st = c.alltoall(view(to_all), view(from_all)); !st.ok()) return fail(st);
      got.push_back(from_all[0] + from_all[block] + from_all[2 * block] + from_all.back());
      std::vector<int32_t> contrib(block * n, r + 1), reduced(block, -1);
      if (absl::Status st = c.reduce_scatter(view(contrib), view(reduced), ReduceOp::kSum); !st.ok()) return fail(st);
      got.push_back(reduced.front() + reduced.back());
      return Outcome{"", got};
    });
    ASSERT_EQ(outcomes.size(), static_cast<size_t>(n));
    expect_ok(outcomes);
    for (int r = 0; r < n; ++r) {
      const auto& v = outcomes[r].values;
      ASSERT_EQ(v.size(), 6u);
      EXPECT_EQ(v[0], 84);
      EXPECT_EQ(v[1], 0 + 10 + 200);
      EXPECT_EQ(v[2], r == 2 ? 1 + 20 : -1);
      EXPECT_EQ(v[3], r * 7);
      // block r of every rank i: i*10 + r
      EXPECT_EQ(v[4], (0 * 10 + r) + (10 + r) + (20 + r) + (20 + r));
      EXPECT_EQ(v[5], 2 * (1 + 2 + 3));
    }
  }
}

TEST_F(CommunicatorTest, PointToPointTagsAnySourceOrderAndProbe) {
  auto outcomes = run(3, [](Communicator& c) {
    std::vector<double> got;
    if (c.rank() != 0) {
      for (int i = 0; i < 3; ++i) {
        int32_t v = c.rank() * 100 + i;
        if (absl::Status st = c.send(TensorView::Contiguous(&v, DType::kInt32, {1}), 0, /*tag=*/c.rank()); !st.ok())
          return fail(st);
      }
      return Outcome{"", got};
    }
    // Tag 2 first: only rank 2's messages match, in the order sent.
    for (int i = 0; i < 3; ++i) {
      int32_t v = -1;
      auto status = c.recv(TensorView::Contiguous(&v, DType::kInt32, {1}), kAnySource, 2);
      if (!status.ok()) return fail(status.status());
      got.push_back(v);
      got.push_back(status->source);
    }
    auto probed = c.probe(1, kAnyTag, absl::Seconds(10));
    if (!probed.ok()) return fail(probed.status());
    got.push_back(static_cast<double>(probed->bytes));
    for (int i = 0; i < 3; ++i) {
      int32_t v = -1;
      Request req = c.irecv(TensorView::Contiguous(&v, DType::kInt32, {1}), 1, kAnyTag);
      auto status = req.wait(absl::Seconds(10));
      if (!status.ok()) return fail(status.status());
      got.push_back(v);
    }
    // Nothing else is coming: a timed-out receive leaves no pending receive.
    int32_t none = 0;
    auto late = c.recv(TensorView::Contiguous(&none, DType::kInt32, {1}), 1, 9, absl::Milliseconds(50));
    got.push_back(late.status().code() == absl::StatusCode::kDeadlineExceeded ? 1 : 0);
    return Outcome{"", got};
  });
  ASSERT_EQ(outcomes.size(), 3u);
  expect_ok(outcomes);
  EXPECT_EQ(outcomes[0].values, (std::vector<double>{200, 2, 201, 2, 202, 2, 4, 100, 101, 102, 1}));
}

TEST_F(CommunicatorTest, AlongSplitAndDup) {
  auto outcomes = run_on(*Shape::Create({{"hosts", 2}, {"gpus", 3}}), [](Communicator& c) {
    std::vector<double> got;
    auto gpus = c.along({"gpus"});
    if (!gpus.ok()) return fail(gpus.status());
    int32_t v = c.rank(), sum = 0;
    if (absl::Status st = gpus->allreduce(TensorView::Contiguous(&v, DType::kInt32, {1}),
                                          TensorView::Contiguous(&sum, DType::kInt32, {1}), ReduceOp::kSum);
        !st.ok())
      return fail(st);
    got.push_back(gpus->size());
    got.push_back(sum);
    auto hosts = c.along({"hosts"});
    if (!hosts.ok()) return fail(hosts.status());
    got.push_back(hosts->rank());
    // Odd ranks, ordered by descending rank; even ranks opt out.
    auto odd = c.split(c.rank() % 2 == 1 ? 1 : kUndefined, -c.rank());
    if (!odd.ok()) return fail(odd.status());
    got.push_back(odd->has_value() ? (*odd)->rank() : -1);
    auto copy = c.dup();
    if (!copy.ok()) return fail(copy.status());
    if (absl::Status st = copy->barrier(); !st.ok()) return fail(st);
    got.push_back(copy->id() != c.id() ? 1 : 0);
    got.push_back(c.along({"nope"}).status().code() == absl::StatusCode::kInvalidArgument ? 1 : 0);
    return Outcome{"", got};
  });
  ASSERT_EQ(outcomes.size(), 6u);
  expect_ok(outcomes);
  // rank = host*3 + gpu: along gpus sums host*3*3 + 0+1+2
  for (int r = 0; r < 6; ++r) ASSERT_EQ(outcomes[r].values.size(), 6u) << "rank " << r;
  for (int r = 0; r < 6; ++r) {
    const int host = r / 3;
    EXPECT_EQ(outcomes[r].values[0], 3);
    EXPECT_EQ(outcomes[r].values[1], host * 9 + 3);
    EXPECT_EQ(outcomes[r].values[2], host);
    EXPECT_EQ(outcomes[r].values[4], 1);
    EXPECT_EQ(outcomes[r].values[5], 1);
  }
  EXPECT_EQ(outcomes[5].values[3], 0);
  EXPECT_EQ(outcomes[3].values[3], 1);
  EXPECT_EQ(outcomes[1].values[3], 2);
  EXPECT_EQ(outcomes[0].values[3], -1);
}

TEST_F(CommunicatorTest, NonBlockingCollectivesOverlap) {
  auto outcomes = run(4, [](Communicator& c) {
    std::vector<int64_t> a(1000, c.rank()), b(1000, 1);
    Request ra = c.iallreduce(TensorView::Contiguous(a.data(), DType::kInt64, {1000}),
                              TensorView::Contiguous(a.data(), DType::kInt64, {1000}), ReduceOp::kMax);
    Request rb = c.iallreduce(TensorView::Contiguous(b.data(), DType::kInt64, {1000}),
                              TensorView::Contiguous(b.data(), DType::kInt64, {1000}), ReduceOp::kSum);
    Request bar = c.ibarrier();
    if (absl::Status st = Request::wait_all({ra, rb, bar}, absl::Seconds(30)); !st.ok()) return fail(st);
    auto any = Request::wait_any({ra, rb}, absl::Seconds(1));
    if (!any.ok()) return fail(any.status());
    return Outcome{"", {double(a[999]), double(b[0])}};
  });
  expect_ok(outcomes);
  for (const auto& o : outcomes) EXPECT_EQ(o.values, (std::vector<double>{3, 4}));
}

// A split/dup communicator dropped while its non-blocking collectives wait
// for a rank that never calls them: they fail with kCancelled naming the
// communicator, instead of waiting for ever (the queued one never starts).
TEST_F(CommunicatorTest, DroppingACommunicatorCancelsItsPendingNonBlockingCollectives) {
  auto outcomes = run(2, [](Communicator& c) {
    absl::StatusOr<Communicator> copy = c.dup();
    if (!copy.ok()) return fail(copy.status());
    if (c.rank() == 1) return Outcome{"", {}};  // never joins the collectives below
    std::optional<Communicator> dup(*std::move(copy));
    int32_t v = 1;
    Request running = dup->iallreduce(TensorView::Contiguous(&v, DType::kInt32, {1}),
                                      TensorView::Contiguous(&v, DType::kInt32, {1}), ReduceOp::kSum);
    Request queued = dup->ibarrier();
    if (running.test().has_value() || queued.test().has_value()) return fail(absl::InternalError("finished early"));
    copy = absl::UnknownError("dropped");
    dup.reset();  // the last handle of rank 0's dup
    std::vector<double> codes;
    for (const Request& r : {running, queued}) {
      absl::StatusOr<MessageStatus> got = r.wait(absl::Minutes(1));
      codes.push_back(static_cast<double>(got.status().code()));
      if (got.status().message().find("destroyed") == std::string_view::npos) {
        return fail(absl::InternalError(absl::StrCat("unexpected error: ", got.status().ToString())));
      }
    }
    return Outcome{"", codes};
  });
  expect_ok(outcomes);
  const double cancelled = static_cast<double>(absl::StatusCode::kCancelled);
  EXPECT_EQ(outcomes[0].values, (std::vector<double>{cancelled, cancelled}));
}

// Rank 0 calls allreduce on 4 elements, the others on 5: every rank gets an
// error that names both calls; none hangs.
TEST_F(CommunicatorTest, MismatchedCollectiveFailsEveryRankNamingBothSides) {
  auto outcomes = run(3, [](Communicator& c) {
    std::vector<float> x(c.rank() == 0 ? 4 : 5, 1.0f);
    absl::Status st = c.allreduce(TensorView::Contiguous(x.data(), DType::kFloat32, {int64_t(x.size())}),
                                  TensorView::Contiguous(x.data(), DType::kFloat32, {int64_t(x.size())}),
                                  ReduceOp::kSum);
    return Outcome{st.ToString(), {}};
  });
  ASSERT_EQ(outcomes.size(), 3u);
  for (const auto& o : outcomes) {
    EXPECT_NE(o.error.find("mismatched collective"), std::string::npos) << o.error;
    EXPECT_NE(o.error.find("count=4"), std::string::npos) << o.error;
    EXPECT_NE(o.error.find("count=5"), std::string::npos) << o.error;
  }
}

TEST_F(CommunicatorTest, BadArgumentsAreClearErrorsOnEveryRank) {
  auto outcomes = run(2, [](Communicator& c) {
    std::vector<double> got;
    int32_t i = 1;
    float f = 1;
    // avg on integers makes no sense: refused on every rank, nobody hangs.
    absl::Status st = c.allreduce(TensorView::Contiguous(&i, DType::kInt32, {1}),
                                  TensorView::Contiguous(&i, DType::kInt32, {1}), ReduceOp::kAvg);
    got.push_back(st.code() == absl::StatusCode::kInvalidArgument ? 1 : 0);
    st = c.allreduce(TensorView::Contiguous(&i, DType::kInt32, {1}), TensorView::Contiguous(&f, DType::kFloat32, {1}),
                     ReduceOp::kSum);
    got.push_back(st.code() == absl::StatusCode::kInvalidArgument ? 1 : 0);
    got.push_back(c.send(TensorView::Contiguous(&i, DType::kInt32, {1}), 7).code() ==
                          absl::StatusCode::kInvalidArgument ? 1 : 0);
    got.push_back(c.broadcast(TensorView::Contiguous(&i, DType::kInt32, {1}), 9).code() ==
                          absl::StatusCode::kInvalidArgument ? 1 : 0);
    auto device = TensorView::Create(&f, DType::kFloat32, {1}, {}, Device{DeviceKind::kCuda, 0});
    if (!device.ok()) return fail(device.status());
    // No tensor_engine backend here (no GPU): a clear error saying how to
    // install it (with a backend, the fake-plugin tests cover this path).
    st = c.allreduce(*device, *device, ReduceOp::kSum);
    got.push_back(load_backend("tensor_engine").ok() ||
                          (st.code() == absl::StatusCode::kFailedPrecondition &&
                           std::string(st.message()).find("castmesh[tensor-engine]") != std::string::npos)
                      ? 1
                      : 0);
    // Still usable afterwards.
    st = c.allreduce(TensorView::Contiguous(&i, DType::kInt32, {1}), TensorView::Contiguous(&i, DType::kInt32, {1}),
                     ReduceOp::kSum);
    if (!st.ok()) return fail(st);
    got.push_back(i);
    return Outcome{"", got};
  });
  expect_ok(outcomes);
  for (const auto& o : outcomes) EXPECT_EQ(o.values, (std::vector<double>{1, 1, 1, 1, 1, 2}));
}

// A mesh's communicators (and those made from it with along()) are kept for
// its members between calls, and released once the mesh is dropped: a
// program that spawns meshes again and again does not accumulate them, nor
// the device communicators made on them.
TEST_F(CommunicatorTest, DroppedMeshReleasesItsCommunicators) {
  auto& exchange = collectives::Exchange::instance();
  const size_t before = exchange.live_groups();
  auto outcomes = run_on(*Shape::Create({{"x", 2}, {"y", 2}}), [](Communicator& c) {
    absl::StatusOr<Communicator> row = c.along({"y"});
    if (!row.ok()) return fail(row.status());
    float v = 1.0f;
    TensorView t = TensorView::Contiguous(&v, DType::kFloat32, {1});
    if (absl::Status st = row->allreduce(t, t, ReduceOp::kSum); !st.ok()) return fail(st);
    if (absl::Status st = c.allreduce(t, t, ReduceOp::kSum); !st.ok()) return fail(st);
    return Outcome{"", {double(v)}};
  });
  ASSERT_EQ(outcomes.size(), 4u);
  expect_ok(outcomes);
  for (const Outcome& o : outcomes) EXPECT_EQ(o.values, std::vector<double>{8});
  // The mesh is dropped as run_on returns; its members may still be
  // unwinding their handlers, so allow them a bounded while.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (exchange.live_groups() > before && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(exchange.live_groups(), before) << "a dropped mesh's communicators are still alive";
}

}  // namespace
}  // namespace castmesh
