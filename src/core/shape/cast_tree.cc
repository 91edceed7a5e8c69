#include "castmesh/cast_tree.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

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

absl::StatusOr<CastRoute> CastRoute::Create(size_t base_size, const Slice& targets,
                                            size_t fanout) {
  if (fanout == 0) return absl::InvalidArgumentError("cast fan-out must be at least 1");
  CastRoute route;
  route.base_size_ = base_size;
  route.fanout_ = fanout;
  route.targets_ = targets.ranks();
  std::sort(route.targets_.begin(), route.targets_.end());
  if (!route.targets_.empty() && route.targets_.back() >= base_size) {
    return absl::OutOfRangeError(absl::StrCat("cast target rank ", route.targets_.back(),
                                              " is outside the mesh of ", base_size, " members"));
  }
  return route;
}

bool CastRoute::holds_target(const CastSpan& span) const {
  auto it = std::lower_bound(targets_.begin(), targets_.end(), span.begin);
  return it != targets_.end() && *it < span.end;
}

bool CastRoute::delivers(const CastSpan& span) const {
  return std::binary_search(targets_.begin(), targets_.end(), span.begin);
}

std::vector<CastSpan> CastRoute::pruned(std::vector<CastSpan> spans) const {
  spans.erase(std::remove_if(spans.begin(), spans.end(),
                             [&](const CastSpan& s) { return !holds_target(s); }),
              spans.end());
  return spans;
}

std::vector<CastSpan> CastRoute::root_children() const {
  return pruned(cast_root_children(base_size_, fanout_));
}

std::vector<CastSpan> CastRoute::children(const CastSpan& span) const {
  return pruned(cast_node_children(span, fanout_));
}

}  // namespace castmesh
