// Internal: how the replies of a mesh request are collected. Used by
// ActorMesh; public only because ActorMesh is a template.
//
//   ReplyGather<R>   one reply per point -> ValueMesh<R> (call)
//   ReduceNode<R>    one node of the reduction tree: its own reply and its
//                    children's partial results, folded in row-major order
//                    (call with a reducer)
//   ReplyQueue<R>    replies handed out as they arrive (stream)
//
// All are thread-safe: replies arrive on whatever thread completes the
// member's request. ReplyGather and ReduceNode count with SlotCollector
// (detail/slot_collector.h) and complete their continuation exactly once,
// outside its lock.
#pragma once

#include <cstddef>
#include <chrono>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/detail/slot_collector.h"
#include "castmesh/shape.h"
#include "castmesh/value_mesh.h"

namespace castmesh::detail {

// The error of a member's request, naming the member's point. Keeps the code.
inline absl::Status member_error(const Point& point, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("mesh member ", point.to_string(), " (rank ",
                                                  point.rank(), "): ", status.message()));
}

// A call's replies, one per point of `shape` -> ValueMesh<R>; the first
// failure fails the call.
template <typename R>
class ReplyGather {
 public:
  using Done = std::function<void(absl::StatusOr<ValueMesh<R>>)>;

  ReplyGather(Shape shape, Done done) : shape_(std::move(shape)), slots_(shape_.size()), done_(std::move(done)) {}

  // The reply of the member at `position` (row-major position in shape()).
  void set_value(size_t position, R value) {
    SlotFill<R> fill = slots_.set(position, std::move(value));
    if (fill.done) done_(*ValueMesh<R>::Create(shape_, *std::move(fill.done)));
  }
  // Fails the whole call (first failure wins; later replies are dropped).
  // A member's failure is reported as member_error(its point, status).
  void fail(absl::Status status) {
    if (slots_.fail()) done_(std::move(status));
  }
  const Shape& shape() const { return shape_; }

 private:
  const Shape shape_;
  SlotCollector<R> slots_;
  const Done done_;
};

// One node of a reduction along the cast tree. Slot 0 is the node's own
// member (when it is a target), slots 1.. its child subtrees in span order,
// so folding the slots left to right folds the members in row-major order.
template <typename R>
class ReduceNode {
 public:
  // Receives the folded result of this subtree, or its first error.
  using Done = std::function<void(absl::StatusOr<R>)>;

  ReduceNode(size_t slots, Reducer<R> reducer, Done done)
      : slots_(slots), reducer_(std::move(reducer)), done_(std::move(done)) {}

  // The partial result of slot `slot`; the last one folds and finishes.
  void set_value(size_t slot, R value) {
    SlotFill<R> fill = slots_.set(slot, std::move(value));
    if (!fill.done) return;
    std::vector<R>& all = *fill.done;
    R folded = std::move(all.front());
    for (size_t i = 1; i < all.size(); ++i) folded = reducer_.combine(std::move(folded), std::move(all[i]));
    done_(std::move(folded));
  }
  // Fails the subtree (first failure wins).
  void fail(absl::Status status) {
    if (slots_.fail()) done_(std::move(status));
  }

 private:
  SlotCollector<R> slots_;
  const Reducer<R> reducer_;
  const Done done_;
};

// Replies in arrival order. The producer side (push/close) is used by the
// mesh; the consumer side is what ActorMesh::stream returns to the user.
template <typename R>
class ReplyQueue {
 public:
  explicit ReplyQueue(size_t expected) : expected_(expected) {}

  void push(Point point, absl::StatusOr<R> value) {
    Item item{std::move(point), value.status(), std::nullopt};
    if (value.ok()) item.value.emplace(*std::move(value));
    {
      detail::MutexLock lock(mu_);
      items_.push_back(std::move(item));
    }
    arrived_.notify_one();
  }

  // The next reply (its point and value or error). Blocks up to `timeout`:
  // DeadlineExceeded when nothing arrived in time, OutOfRange once every
  // expected reply has been taken.
  absl::StatusOr<std::pair<Point, absl::StatusOr<R>>> next(
      absl::Duration timeout = absl::InfiniteDuration()) {
    detail::MutexLock lock(mu_);
    if (taken_ == expected_) return absl::OutOfRangeError("every reply of the stream was taken");
    auto has_item = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !items_.empty(); };
    const bool arrived = arrived_.wait_for(lock, timeout, has_item);
    if (!arrived) {
      return absl::DeadlineExceededError(absl::StrCat("no reply within ", absl::FormatDuration(timeout),
                                                      " (", taken_, " of ", expected_, " taken)"));
    }
    Item item = std::move(items_.front());
    items_.pop_front();
    ++taken_;
    if (item.value.has_value()) {
      return std::make_pair(std::move(item.point), absl::StatusOr<R>(std::move(*item.value)));
    }
    return std::make_pair(std::move(item.point), absl::StatusOr<R>(std::move(item.status)));
  }
  size_t expected() const { return expected_; }

 private:
  // A reply as queued (a plain struct rather than a StatusOr, which GCC's
  // -O2 flow analysis misreads as maybe-uninitialized when moved).
  struct Item {
    Point point;
    absl::Status status;
    std::optional<R> value;
  };
  const size_t expected_;
  detail::Mutex mu_;
  detail::CondVar arrived_;
  std::deque<Item> items_ ABSL_GUARDED_BY(mu_);
  size_t taken_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace castmesh::detail
