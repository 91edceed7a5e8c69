#include "castmesh/value_mesh.h"

#include <gtest/gtest.h>

#include <string>

namespace castmesh {
namespace {

ValueMesh<int> sample() {
  Shape s = *Shape::Create({{"hosts", 2}, {"gpus", 4}});
  std::vector<int> v;
  for (int i = 0; i < 8; ++i) v.push_back(10 * i);
  return *ValueMesh<int>::Create(s, v);
}

TEST(ValueMesh, IndexByPointCoordsAndNames) {
  ValueMesh<int> vm = sample();
  EXPECT_EQ(vm.size(), 8u);
  Point p = *vm.shape().point_of_coords({1, 2});
  EXPECT_EQ(vm[p], 60);
  EXPECT_EQ(*vm.at(p), 60);
  EXPECT_EQ(*vm.at_coords({0, 3}), 30);
  EXPECT_EQ(*vm.at({{"gpus", 1}, {"hosts", 1}}), 50);
  EXPECT_EQ(vm.at({{"gpu", 1}, {"hosts", 1}}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(vm.at_coords({2, 0}).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(ValueMesh, CreateChecksSize) {
  Shape s = *Shape::Create({{"x", 3}});
  EXPECT_EQ(ValueMesh<int>::Create(s, {1, 2}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValueMesh, IterationAndItems) {
  ValueMesh<int> vm = sample();
  int total = 0;
  for (int v : vm) total += v;
  EXPECT_EQ(total, 280);
  std::vector<std::string> lines;
  for (const auto& [point, value] : vm.items()) {
    lines.push_back(point.to_string() + ":" + std::to_string(value));
  }
  ASSERT_EQ(lines.size(), 8u);
  EXPECT_EQ(lines.front(), "{hosts=0, gpus=0}:0");
  EXPECT_EQ(lines[5], "{hosts=1, gpus=1}:50");
}

TEST(ValueMesh, Reducers) {
  ValueMesh<int> vm = sample();
  EXPECT_EQ(vm.reduce(reducers::sum<int>()), 280);
  EXPECT_EQ(vm.reduce(reducers::min<int>()), 0);
  EXPECT_EQ(vm.reduce(reducers::max<int>()), 70);
  // A user reduction that is associative but not commutative sees row-major order.
  ValueMesh<std::string> names = vm.map([](int v) { return std::to_string(v / 10); });
  EXPECT_EQ(names.reduce(reducers::custom<std::string>(
                "concat", [](std::string a, std::string b) { return a + b; })),
            "01234567");
}

TEST(ValueMesh, SelectAndRestrictToSubShapes) {
  ValueMesh<int> vm = sample();
  absl::StatusOr<ValueMesh<int>> gpu2 = vm.select("gpus", 2);
  ASSERT_TRUE(gpu2.ok()) << gpu2.status();
  EXPECT_EQ(gpu2->values(), (std::vector<int>{20, 60}));
  // A point of the parent shape indexes the sub-mesh through its rank.
  Point parent_point = *vm.shape().point_of_coords({1, 2});
  EXPECT_EQ(*gpu2->at(parent_point), 60);
  EXPECT_EQ(gpu2->at(*vm.shape().point_of_coords({1, 1})).status().code(), absl::StatusCode::kNotFound);
  Shape odd = *vm.shape().select("gpus", Range(1, 4, 2));
  EXPECT_EQ(vm.restrict_to(odd)->values(), (std::vector<int>{10, 30, 50, 70}));
  // Restricting a sub-mesh to something outside it is an error.
  EXPECT_EQ(gpu2->restrict_to(odd).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace castmesh
