// The cast tree: every member reached exactly once, bounded fan-out at every
// hop, logarithmic depth, contiguous subtrees.
#include "castmesh/cast_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

namespace castmesh {
namespace {

TEST(CastTree, SplitIsContiguousAndBalanced) {
  EXPECT_EQ(split_cast_span(0, 10, 3),
            (std::vector<CastSpan>{{0, 4}, {4, 7}, {7, 10}}));
  EXPECT_EQ(split_cast_span(5, 7, 8), (std::vector<CastSpan>{{5, 6}, {6, 7}}));
  EXPECT_TRUE(split_cast_span(3, 3, 8).empty());
  EXPECT_EQ(split_cast_span(0, 3, 0).size(), 1u);  // fan-out 0 treated as 1
}

TEST(CastTree, Example64WithFanout8HasDepth2) {
  absl::StatusOr<CastTree> tree = CastTree::Plan(64, 8);
  ASSERT_TRUE(tree.ok());
  EXPECT_EQ(tree->root_children(), (std::vector<size_t>{0, 8, 16, 24, 32, 40, 48, 56}));
  EXPECT_EQ(tree->children(8), (std::vector<size_t>{9, 10, 11, 12, 13, 14, 15}));
  EXPECT_TRUE(tree->children(9).empty());
  EXPECT_EQ(tree->depth(), 2u);
}

TEST(CastTree, DirectFanoutWhenFanoutCoversMesh) {
  absl::StatusOr<CastTree> tree = CastTree::Plan(16, 16);
  ASSERT_TRUE(tree.ok());
  EXPECT_EQ(tree->root_children().size(), 16u);
  EXPECT_EQ(tree->depth(), 1u);
}

TEST(CastTree, RejectsZeroFanout) {
  EXPECT_EQ(CastTree::Plan(4, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// Property: for all sizes and fan-outs, the tree covers every member exactly
// once, no node (nor the sender) sends more than `fanout`, the depth is within
// one of ceil(log_fanout(n)), and each subtree is a contiguous span.
TEST(CastTree, CoversEveryMemberOnceWithLogDepth) {
  for (size_t fanout : {1u, 2u, 3u, 4u, 8u, 16u}) {
    for (size_t n = 0; n <= 300; n += (n < 70 ? 1 : 23)) {
      absl::StatusOr<CastTree> tree = CastTree::Plan(n, fanout);
      ASSERT_TRUE(tree.ok());
      std::vector<int> reached(n, 0);
      ASSERT_LE(tree->root_children().size(), fanout);
      for (size_t c : tree->root_children()) reached[c]++;
      for (size_t p = 0; p < n; ++p) {
        ASSERT_LE(tree->children(p).size(), fanout);
        for (size_t c : tree->children(p)) {
          reached[c]++;
          ASSERT_GT(c, p) << "children come after their parent in row-major order";
          ASSERT_EQ(tree->depth_of(c), tree->depth_of(p) + 1);
        }
      }
      for (size_t p = 0; p < n; ++p) ASSERT_EQ(reached[p], 1) << "n=" << n << " p=" << p;
      if (n == 0) {
        EXPECT_EQ(tree->depth(), 0u);
        continue;
      }
      if (fanout == 1) {
        ASSERT_EQ(tree->depth(), n);  // a chain
        continue;
      }
      double log_n = std::log(static_cast<double>(n)) / std::log(static_cast<double>(fanout));
      size_t bound = static_cast<size_t>(std::ceil(log_n - 1e-9)) + 1;
      ASSERT_LE(tree->depth(), bound) << "n=" << n << " fanout=" << fanout;
      ASSERT_GE(tree->depth(), static_cast<size_t>(std::floor(log_n + 1e-9)) > 0
                                   ? static_cast<size_t>(std::floor(log_n + 1e-9))
                                   : 1u);
    }
  }
}

TEST(CastTree, SubtreesAreContiguousSpans) {
  // Walk hop by hop as a real cast does and check each node's subtree is
  // exactly its span.
  const size_t n = 100, fanout = 4;
  std::vector<size_t> owner(n, SIZE_MAX);
  std::vector<CastSpan> stack = cast_root_children(n, fanout);
  while (!stack.empty()) {
    CastSpan s = stack.back();
    stack.pop_back();
    ASSERT_EQ(owner[s.begin], SIZE_MAX);
    owner[s.begin] = s.begin;
    size_t covered = 1;
    for (CastSpan c : cast_node_children(s, fanout)) {
      ASSERT_GE(c.begin, s.begin + 1);
      ASSERT_LE(c.end, s.end);
      covered += c.size();
      stack.push_back(c);
    }
    ASSERT_EQ(covered, s.size());
  }
}

}  // namespace
}  // namespace castmesh

namespace castmesh {
namespace {

struct Walk {
  std::vector<int> delivered;              // per base rank
  std::vector<std::vector<size_t>> paths;  // per base rank: span heads from the sender
  size_t messages = 0;                     // hops sent, sender included
  size_t sender_messages = 0;
  size_t max_node_messages = 0;
};

Walk walk(const CastRoute& route) {
  Walk w;
  w.delivered.assign(route.base_size(), 0);
  w.paths.assign(route.base_size(), {});
  struct Hop {
    CastSpan span;
    std::vector<size_t> path;
  };
  std::vector<Hop> stack;
  for (CastSpan s : route.root_children()) stack.push_back({s, {s.begin}});
  w.sender_messages = w.messages = stack.size();
  while (!stack.empty()) {
    Hop hop = stack.back();
    stack.pop_back();
    if (route.delivers(hop.span)) {
      w.delivered[hop.span.begin]++;
      w.paths[hop.span.begin] = hop.path;
    }
    std::vector<CastSpan> children = route.children(hop.span);
    w.messages += children.size();
    w.max_node_messages = std::max(w.max_node_messages, children.size());
    for (CastSpan c : children) {
      std::vector<size_t> path = hop.path;
      path.push_back(c.begin);
      stack.push_back({c, path});
    }
  }
  return w;
}

// Property: for random slices of random meshes, the pruned route delivers to
// exactly the slice's members, the path to a member does not depend on the
// slice (the ordering guarantee), and the message count stays near |slice|.
TEST(CastRoute, DeliversExactlyToSliceAlongFixedPaths) {
  std::mt19937 rng(7);
  auto uniform = [&](size_t lo, size_t hi) {
    return std::uniform_int_distribution<size_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 200; ++trial) {
    Shape base = *Shape::Create({{"a", uniform(1, 5)}, {"b", uniform(1, 9)}, {"c", uniform(1, 3)}});
    size_t fanout = uniform(1, 9);
    CastRoute whole_route = *CastRoute::Create(base.size(), base.slice(), fanout);
    Walk whole = walk(whole_route);
    ASSERT_EQ(whole.messages, base.size()) << "casting to the whole mesh: one message per member";

    Shape sub = base;
    for (const char* dim : {"a", "b", "c"}) {
      size_t n = *sub.size_of(dim);
      int64_t start = static_cast<int64_t>(uniform(0, n - 1));
      int64_t stop = static_cast<int64_t>(uniform(static_cast<size_t>(start) + 1, n));
      sub = *sub.select(dim, Range(start, stop, static_cast<int64_t>(uniform(1, 2))));
    }
    CastRoute route = *CastRoute::Create(base.size(), sub.slice(), fanout);
    Walk w = walk(route);
    std::vector<size_t> members = sub.slice().ranks();
    std::vector<int> expected(base.size(), 0);
    for (size_t r : members) expected[r] = 1;
    ASSERT_EQ(w.delivered, expected) << sub.to_string();
    for (size_t r : members) ASSERT_EQ(w.paths[r], whole.paths[r]) << "rank " << r;
    ASSERT_LE(w.sender_messages, fanout);
    ASSERT_LE(w.max_node_messages, fanout);
    size_t depth = CastTree::Plan(base.size(), fanout)->depth();
    ASSERT_LE(w.messages, members.size() * depth);
  }
}

TEST(CastRoute, Errors) {
  Slice s = *Slice::RowMajor({4});
  EXPECT_EQ(CastRoute::Create(2, s, 8).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(CastRoute::Create(4, s, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace castmesh
