#include "castmesh/cast_tree.h"

#include <algorithm>

#include "absl/status/status.h"

namespace castmesh {

std::vector<CastSpan> split_cast_span(size_t begin, size_t end, size_t fanout) {
  std::vector<CastSpan> spans;
  if (end <= begin) return spans;
  fanout = std::max<size_t>(fanout, 1);
  const size_t n = end - begin;
  const size_t parts = std::min(fanout, n);
  const size_t base = n / parts;
  const size_t longer = n % parts;  // the first `longer` parts get one more
  spans.reserve(parts);
  size_t at = begin;
  for (size_t i = 0; i < parts; ++i) {
    size_t len = base + (i < longer ? 1 : 0);
    spans.push_back(CastSpan{at, at + len});
    at += len;
  }
  return spans;
}

absl::StatusOr<CastTree> CastTree::Plan(size_t n, size_t fanout) {
  if (fanout == 0) return absl::InvalidArgumentError("cast fan-out must be at least 1");
  CastTree tree;
  tree.fanout_ = fanout;
  tree.children_.resize(n);
  tree.depth_.assign(n, 0);
  // Breadth-first walk of the spans, exactly as the hops compute them.
  std::vector<std::pair<CastSpan, size_t>> frontier;
  for (CastSpan s : cast_root_children(n, fanout)) {
    tree.root_children_.push_back(s.begin);
    frontier.emplace_back(s, 1);
  }
  while (!frontier.empty()) {
    auto [span, depth] = frontier.back();
    frontier.pop_back();
    tree.depth_[span.begin] = depth;
    for (CastSpan child : cast_node_children(span, fanout)) {
      tree.children_[span.begin].push_back(child.begin);
      frontier.emplace_back(child, depth + 1);
    }
  }
  return tree;
}

size_t CastTree::depth() const {
  return depth_.empty() ? 0 : *std::max_element(depth_.begin(), depth_.end());
}

}  // namespace castmesh
