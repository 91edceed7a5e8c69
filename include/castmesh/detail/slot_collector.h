// Internal: SlotCollector<T>, the one place where the replies of a mesh
// request are counted in. Every gather and reduction (ReplyGather,
// ReduceNode, the caller's fold of per-proc pieces, each cast relay's node)
// collects N slots with it; public only because ActorMesh is a template.
//
//   SlotCollector<int> c(4);
//   c.set(3, 40);                    // stored; 3 slots left
//   c.set(3, 41);                    // a repeat: ignored
//   c.set(0, 10, /*width=*/2);       // one value standing for slots 0 and 1
//   SlotFill<int> f = c.set(2, 30);  // the last slot: *f.done == {10, 30, 40}
//
// Rules: a slot is filled once (later values for it are ignored); the
// collection finishes exactly once, either when its last slot is filled or
// at its first failure (first error wins; later values and errors are
// ignored). The one call that finishes it is told so (SlotFill::done, or
// fail() returning true), so the caller runs its continuation outside the
// lock, exactly once. A collection of 0 slots never finishes by itself.
//
// Thread-safe: any thread may fill or fail.
#pragma once

#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "castmesh/detail/mutex.h"

namespace castmesh::detail {

// What SlotCollector::set did with a value. Plain value.
template <typename T>
struct SlotFill {
  // false: its slot was filled already or the collection had finished.
  bool stored = false;
  // Set for the one call that filled the last slot: the stored values in
  // slot order (one per value, not per slot it stands for).
  std::optional<std::vector<T>> done;
};

// Collects N slots from many threads; finishes once (see above).
template <typename T>
class SlotCollector {
 public:
  explicit SlotCollector(size_t slots) : size_(slots), values_(slots), filled_(slots, false), remaining_(slots) {}
  SlotCollector(const SlotCollector&) = delete;
  SlotCollector& operator=(const SlotCollector&) = delete;

  // Stores `value` at `slot` (< size()) and counts it for `width` slots
  // (slot .. slot + width - 1, clipped at size(); those already filled
  // count once): a value standing for a run, e.g. a folded subtree.
  // Ignored when `slot` itself is filled or the collection finished.
  SlotFill<T> set(size_t slot, T value, size_t width = 1) {
    SlotFill<T> out;
    detail::MutexLock lock(mu_);
    if (finished_ || filled_[slot]) return out;
    out.stored = true;
    values_[slot].emplace(std::move(value));
    for (size_t k = slot; k < filled_.size() && k - slot < width; ++k) {
      if (filled_[k]) continue;
      filled_[k] = true;
      --remaining_;
    }
    if (remaining_ != 0) return out;
    finished_ = true;
    std::vector<T> all;
    for (std::optional<T>& v : values_) {
      if (v.has_value()) all.push_back(std::move(*v));
    }
    out.done.emplace(std::move(all));
    return out;
  }

  // Finishes the collection as failed. True for the first call when it had
  // not finished (the caller reports the error); false otherwise.
  bool fail() {
    detail::MutexLock lock(mu_);
    if (finished_) return false;
    finished_ = true;
    return true;
  }

  // Number of slots.
  size_t size() const { return size_; }

 private:
  const size_t size_;
  detail::Mutex mu_;
  std::vector<std::optional<T>> values_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> filled_ ABSL_GUARDED_BY(mu_);  // size_ of them
  size_t remaining_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace castmesh::detail
