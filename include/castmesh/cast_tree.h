// The fan-out tree along which a cast reaches every member of a mesh.
//
// The members of a (sliced) mesh are numbered by position 0 .. n-1 (row-major
// order of their points). A node responsible for a span [begin, end) of
// positions delivers the message to the member at `begin` and forwards it to
// up to `fanout` children, each responsible for one contiguous, near-equal
// part of [begin+1, end). The sender (the root, not itself a member) splits
// [0, n) the same way. Hence:
//   - the sender and every node send at most `fanout` messages;
//   - each member is reached exactly once;
//   - the depth is about log_fanout(n);
//   - subtrees are contiguous in row-major order, so with a {hosts, gpus}
//     shape most forwarding stays within a host;
//   - a node needs only its own span and the fan-out to find its children:
//     forwarding is stateless, the span travels with the message.
// fanout >= n degenerates to direct fan-out (the sender messages everyone).
//
// Pure functions over integers; callable from any thread.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "castmesh/shape.h"

namespace castmesh {

// A contiguous run of positions; the node at `begin` is responsible for all.
struct CastSpan {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
  friend bool operator==(const CastSpan&, const CastSpan&) = default;
};

// Splits [begin, end) into at most `fanout` contiguous near-equal spans (the
// first ones one longer when it does not divide evenly). Empty input gives
// no spans. `fanout` must be >= 1 (0 is treated as 1).
std::vector<CastSpan> split_cast_span(size_t begin, size_t end, size_t fanout);

// The spans the sender sends to directly, for a mesh of n members.
inline std::vector<CastSpan> cast_root_children(size_t n, size_t fanout) {
  return split_cast_span(0, n, fanout);
}

// The spans a node forwards to, given the span it received (it delivers to
// span.begin itself).
inline std::vector<CastSpan> cast_node_children(CastSpan span, size_t fanout) {
  return split_cast_span(span.begin + 1, span.end, fanout);
}

// The whole tree, for inspection, tests and benchmarks (a real cast computes
// children hop by hop with cast_node_children).
class CastTree {
 public:
  // Errors: fanout == 0.
  static absl::StatusOr<CastTree> Plan(size_t n, size_t fanout);

  size_t size() const { return children_.size(); }
  size_t fanout() const { return fanout_; }
  // Positions the sender messages directly.
  const std::vector<size_t>& root_children() const { return root_children_; }
  // Positions the member at `position` forwards to.
  const std::vector<size_t>& children(size_t position) const { return children_[position]; }
  // Hops from the sender to the member at `position` (1 for root children).
  size_t depth_of(size_t position) const { return depth_[position]; }
  // Largest depth_of over all members (0 for an empty tree).
  size_t depth() const;

 private:
  size_t fanout_ = 1;
  std::vector<size_t> root_children_;
  std::vector<std::vector<size_t>> children_;
  std::vector<size_t> depth_;
};

// The route of one cast to a slice of a base mesh of `base_size` members.
//
// The tree is always the tree of the *base* mesh (positions = base ranks
// 0 .. base_size-1), pruned to the subtrees that hold a target: a node
// forwards only into child spans that contain a member of the slice, and
// delivers to its own member only if that member is a target. Because the
// path from the sender to a member is then the same whatever slice is cast
// to, two casts from one sender reach every member in the order they were
// sent (each hop is FIFO), even when they target different slices. The cost
// is a few extra hops through non-target nodes: at most (depth - 1) extra
// messages per target, none when casting to the whole mesh.
//
// Immutable after construction; share one route among all hops of a cast
// (in process) or rebuild it from (base_size, slice, fanout) in each proc.
class CastRoute {
 public:
  // Errors: fanout == 0, a rank of `targets` outside the base mesh.
  static absl::StatusOr<CastRoute> Create(size_t base_size, const Slice& targets, size_t fanout);

  size_t base_size() const { return base_size_; }
  size_t fanout() const { return fanout_; }
  // Target ranks, increasing.
  const std::vector<size_t>& targets() const { return targets_; }
  // Whether the node at span.begin delivers to its own member.
  bool delivers(const CastSpan& span) const;
  // Spans the sender sends to (each holds at least one target).
  std::vector<CastSpan> root_children() const;
  // Spans the node at span.begin forwards to (each holds at least one target).
  std::vector<CastSpan> children(const CastSpan& span) const;

 private:
  bool holds_target(const CastSpan& span) const;
  std::vector<CastSpan> pruned(std::vector<CastSpan> spans) const;

  size_t base_size_ = 0;
  size_t fanout_ = 1;
  std::vector<size_t> targets_;
};

}  // namespace castmesh
