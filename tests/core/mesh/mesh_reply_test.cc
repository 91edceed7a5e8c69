// Reply collection of mesh requests: gather into a ValueMesh, reduce along a
// tree in row-major order, stream in arrival order. Replies are set from many
// threads to exercise the locking.
#include "castmesh/detail/mesh_reply.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace castmesh::detail {
namespace {

Shape shape_2x4() { return *Shape::Create({{"hosts", 2}, {"gpus", 4}}); }

TEST(ReplyGather, CompletesOnceWithEveryValueAtItsPoint) {
  std::atomic<int> completions{0};
  absl::StatusOr<ValueMesh<int>> result = absl::UnknownError("not done");
  ReplyGather<int> gather(shape_2x4(), [&](absl::StatusOr<ValueMesh<int>> r) {
    completions++;
    result = std::move(r);
  });
  std::vector<std::thread> threads;
  for (size_t p = 0; p < 8; ++p) {
    threads.emplace_back([&, p] { gather.set_value(7 - p, static_cast<int>(100 + 7 - p)); });
  }
  for (auto& t : threads) t.join();
  gather.set_value(3, -1);  // a duplicate after completion is dropped
  ASSERT_EQ(completions.load(), 1);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result->at({{"hosts", 1}, {"gpus", 2}}), 106);
  EXPECT_EQ(result->values(), (std::vector<int>{100, 101, 102, 103, 104, 105, 106, 107}));
}

TEST(ReplyGather, FirstErrorFailsTheCallNamingThePoint) {
  int completions = 0;
  absl::Status status;
  ReplyGather<int> gather(shape_2x4(), [&](absl::StatusOr<ValueMesh<int>> r) {
    completions++;
    status = r.status();
  });
  gather.set_value(0, 1);
  Shape shape = shape_2x4();
  gather.fail(member_error(*shape.point_at(6), absl::UnavailableError("actor local/w[6] stopped: boom")));
  gather.fail(member_error(*shape.point_at(7), absl::UnavailableError("second")));
  for (size_t p = 1; p < 6; ++p) gather.set_value(p, 1);
  EXPECT_EQ(completions, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("{hosts=1, gpus=2}"), std::string::npos) << status;
  EXPECT_NE(status.message().find("boom"), std::string::npos) << status;
}

TEST(ReduceNode, FoldsSlotsInOrderWhateverTheArrivalOrder) {
  auto concat = reducers::custom<std::string>("concat", [](std::string a, std::string b) { return a + b; });
  std::string out;
  ReduceNode<std::string> node(4, concat, [&](absl::StatusOr<std::string> r) { out = *r; });
  node.set_value(2, "c");
  node.set_value(0, "a");
  node.set_value(3, "d");
  EXPECT_EQ(out, "");
  node.set_value(1, "b");
  EXPECT_EQ(out, "abcd");
}

TEST(ReduceNode, ErrorPropagatesOnce) {
  int calls = 0;
  absl::Status st;
  ReduceNode<int> node(2, reducers::sum<int>(), [&](absl::StatusOr<int> r) {
    calls++;
    st = r.status();
  });
  node.fail(absl::InternalError("child died"));
  node.set_value(0, 1);
  node.set_value(1, 1);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
}

TEST(ReplyQueue, DeliversInArrivalOrderThenEnds) {
  Shape s = shape_2x4();
  ReplyQueue<int> q(2);
  EXPECT_EQ(q.next(absl::Milliseconds(1)).status().code(), absl::StatusCode::kDeadlineExceeded);
  std::thread producer([&] {
    q.push(*s.point_at(5), 50);
    q.push(*s.point_at(1), absl::UnavailableError("dead"));
  });
  auto first = q.next();
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->first.position(), 5u);
  EXPECT_EQ(*first->second, 50);
  auto second = q.next();
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->second.status().code(), absl::StatusCode::kUnavailable);
  producer.join();
  EXPECT_EQ(q.next().status().code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace castmesh::detail
