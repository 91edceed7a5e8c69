// Shapes of meshes: named dimensions over a strided set of ranks.
//
// A mesh of procs (or actors) is addressed by a Shape such as {hosts: 2, gpus: 4}.
// The Shape is a *view*: its Slice maps coordinates to the ranks of the
// underlying (base) mesh through an offset and per-dimension strides, so
// selecting, flattening and reshaping never copy or renumber anything; a
// sub-mesh's ranks are still the base mesh's ranks.
//
// Vocabulary used throughout castmesh:
//   - coordinates: one index per dimension of a Shape;
//   - position: the row-major linear index of a point within its Shape
//     (0 .. size()-1); positions are what a ValueMesh is ordered by;
//   - rank (or base rank): the index of the member in the base mesh, i.e.
//     Slice::location(coordinates).
//
// All types here are immutable values: copyable, cheap to copy (Shape and
// Point share their dimension data), and safe to use from any thread
// concurrently. Operations that can fail on user input return absl::Status
// with a message naming the dimension and the bad value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace castmesh {

// A strided selection of indices along one dimension, like Python's
// `slice(start, stop, step)`: start, start+step, ... while < stop.
// `Range::kEnd` as stop means "to the end of the dimension".
// Indices are non-negative (no Python-style negative indexing); step >= 1.
// An empty selection (start >= stop) is an error when applied, because a
// mesh with no members cannot be messaged.
struct Range {
  static constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();

  int64_t start = 0;
  int64_t stop = kEnd;
  int64_t step = 1;

  constexpr Range() = default;
  constexpr Range(int64_t start_index, int64_t stop_index, int64_t step_size = 1)
      : start(start_index), stop(stop_index), step(step_size) {}

  // Every `step`-th index of the whole dimension: Range::every(2) == 0, 2, 4, ...
  static constexpr Range every(int64_t step_size) { return Range(0, kEnd, step_size); }
  // All indices from `start_index` on.
  static constexpr Range from(int64_t start_index) { return Range(start_index, kEnd, 1); }

  std::string to_string() const;
};

// What to select along one named dimension: an index (the dimension is
// dropped) or a Range (the dimension is kept, possibly shorter).
using Selector = std::variant<int64_t, Range>;

// The strided map from coordinates to base ranks:
//   location(c) = offset + sum_i c[i] * strides[i],   0 <= c[i] < sizes[i].
// Invariant (checked by Create): no two coordinates map to the same rank, in
// the strong form that lets coordinates() invert location() by division:
// ordered by decreasing stride, each stride exceeds the largest offset
// reachable with the smaller-stride dimensions. Every slice obtained from a
// row-major base by select()/reshape() satisfies it.
class Slice {
 public:
  // A 0-dimensional slice holding the single rank 0.
  Slice() = default;

  // Validates and builds a slice. Errors: sizes/strides of different length,
  // a zero size, a zero stride on a dimension of size > 1, overlapping ranks.
  static absl::StatusOr<Slice> Create(size_t offset, std::vector<size_t> sizes,
                                      std::vector<size_t> strides);
  // The row-major slice over ranks 0 .. product(sizes)-1. Errors: a zero size.
  static absl::StatusOr<Slice> RowMajor(std::vector<size_t> sizes);

  size_t offset() const { return offset_; }
  const std::vector<size_t>& sizes() const { return sizes_; }
  const std::vector<size_t>& strides() const { return strides_; }
  size_t ndim() const { return sizes_.size(); }
  // Number of ranks in the slice (1 for a 0-dimensional slice).
  size_t size() const;

  // Base rank of the given coordinates. Errors: wrong number of coordinates,
  // a coordinate out of range.
  absl::StatusOr<size_t> location(const std::vector<size_t>& coords) const;
  // Coordinates of a base rank; NotFound when the rank is not in the slice.
  absl::StatusOr<std::vector<size_t>> coordinates(size_t rank) const;
  // Base rank of the member at a row-major position (0 .. size()-1).
  absl::StatusOr<size_t> rank_at(size_t position) const;
  // Position (row-major index within this slice) of a base rank; NotFound
  // when the rank is not in the slice.
  absl::StatusOr<size_t> position_of(size_t rank) const;
  // Every base rank, in row-major order of the coordinates.
  std::vector<size_t> ranks() const;

  // True when the ranks are exactly offset .. offset+size()-1 in row-major
  // order (the slice could be flattened to one dimension of stride 1).
  bool is_contiguous() const;

  // Keeps indices r.start, r.start+r.step, ... < r.stop of dimension `dim`.
  absl::StatusOr<Slice> select(size_t dim, const Range& r) const;
  // Fixes dimension `dim` at `index` and drops it.
  absl::StatusOr<Slice> at(size_t dim, int64_t index) const;
  // The same ranks in the same row-major order, viewed with new sizes,
  // without copying. Fails (FailedPrecondition) when the strides cannot
  // express the new shape (e.g. flattening a dimension selected with a step
  // together with its neighbour), or (InvalidArgument) when the number of
  // elements differs.
  absl::StatusOr<Slice> reshape(const std::vector<size_t>& new_sizes) const;

  std::string to_string() const;
  friend bool operator==(const Slice&, const Slice&) = default;

 private:
  Slice(size_t offset, std::vector<size_t> sizes, std::vector<size_t> strides)
      : offset_(offset), sizes_(std::move(sizes)), strides_(std::move(strides)) {}

  size_t offset_ = 0;
  std::vector<size_t> sizes_;
  std::vector<size_t> strides_;
};

class Point;
class PointRange;

// Named dimensions over a Slice, e.g. {hosts: 2, gpus: 4}. Dimension names
// are unique and non-empty. A Shape with no dimensions has exactly one point.
class Shape {
 public:
  // The 0-dimensional shape (one point, rank 0).
  Shape();

  // A row-major shape over ranks 0 .. product-1, dimensions in the given
  // order. Errors: empty or duplicate names, a zero size.
  static absl::StatusOr<Shape> Create(
      std::vector<std::pair<std::string, size_t>> dims);
  // Named dimensions over an existing slice. Errors: label count differs from
  // the slice's dimensions, empty or duplicate names.
  static absl::StatusOr<Shape> Create(std::vector<std::string> labels, Slice slice);

  const std::vector<std::string>& labels() const;
  const Slice& slice() const;
  const std::vector<size_t>& sizes() const { return slice().sizes(); }
  size_t ndim() const { return labels().size(); }
  // Number of points.
  size_t size() const { return slice().size(); }

  // Index of a dimension by name; NotFound naming the known dimensions.
  absl::StatusOr<size_t> dim(std::string_view name) const;
  // Size of a dimension by name.
  absl::StatusOr<size_t> size_of(std::string_view name) const;

  // Selects along one dimension: an index drops it, a Range keeps it.
  // Errors: unknown dimension, index/range out of bounds, empty range.
  absl::StatusOr<Shape> select(std::string_view name, int64_t index) const;
  absl::StatusOr<Shape> select(std::string_view name, const Range& range) const;
  absl::StatusOr<Shape> select(std::string_view name, const Selector& selector) const;
  // Several selections applied left to right, e.g.
  // shape.select({{"hosts", 1}, {"gpus", Range(0, 4, 2)}}).
  absl::StatusOr<Shape> select(
      std::initializer_list<std::pair<std::string_view, Selector>> selections) const;
  absl::StatusOr<Shape> select(
      const std::vector<std::pair<std::string, Selector>>& selections) const;

  // All points viewed as one dimension `name` (same ranks, same order).
  // Errors as Slice::reshape.
  absl::StatusOr<Shape> flatten(std::string name) const;
  // The same points in the same row-major order with new named dimensions,
  // e.g. {gpus: 8} -> {nodes: 2, gpus: 4}. Errors: bad names, element count
  // differs, strides cannot express it (see Slice::reshape).
  absl::StatusOr<Shape> reshape(std::vector<std::pair<std::string, size_t>> dims) const;

  // The point with the given coordinates (one per dimension, in order).
  absl::StatusOr<Point> point_of_coords(absl::Span<const size_t> coords) const;
  // The point with the given named coordinates; every dimension must be
  // named exactly once, e.g. {{"hosts", 1}, {"gpus", 2}}.
  absl::StatusOr<Point> point(
      const std::vector<std::pair<std::string, size_t>>& named_coords) const;
  // The point at a row-major position (0 .. size()-1).
  absl::StatusOr<Point> point_at(size_t position) const;
  // The point whose base rank is `rank`; NotFound when not in this shape.
  absl::StatusOr<Point> point_of_rank(size_t rank) const;
  // Every point in row-major order.
  PointRange points() const;

  // "{hosts=2, gpus=4}"; a strided view also shows its slice.
  std::string to_string() const;
  friend bool operator==(const Shape& a, const Shape& b);

 private:
  struct Rep;
  explicit Shape(std::shared_ptr<const Rep> rep) : rep_(std::move(rep)) {}
  std::shared_ptr<const Rep> rep_;
};

// One point of a Shape: its coordinates, row-major position and base rank.
// Holds a reference-counted handle to its shape's data, so it stays valid
// after the Shape it came from is gone.
class Point {
 public:
  const Shape& shape() const { return shape_; }
  const std::vector<size_t>& coords() const { return coords_; }
  // Row-major index of this point within its shape.
  size_t position() const { return position_; }
  // Base rank (the rank of this member in the base mesh).
  size_t rank() const { return rank_; }
  // Coordinate along a named dimension; NotFound for an unknown name.
  absl::StatusOr<size_t> coord(std::string_view name) const;

  // "{hosts=1, gpus=2}" (a 0-dimensional point prints "{}").
  std::string to_string() const;
  friend bool operator==(const Point& a, const Point& b) {
    return a.rank_ == b.rank_ && a.coords_ == b.coords_ && a.shape_ == b.shape_;
  }

 private:
  friend class Shape;
  friend class PointRange;
  Point(Shape shape, std::vector<size_t> coords, size_t position, size_t rank)
      : shape_(std::move(shape)),
        coords_(std::move(coords)),
        position_(position),
        rank_(rank) {}

  Shape shape_;
  std::vector<size_t> coords_;
  size_t position_;
  size_t rank_;
};

// The points of a Shape in row-major order, computed on the fly (an input
// range: `for (const Point& p : shape.points())`).
class PointRange {
 public:
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Point;
    using difference_type = std::ptrdiff_t;
    using pointer = const Point*;
    using reference = Point;

    iterator() = default;
    Point operator*() const;
    iterator& operator++() {
      ++position_;
      return *this;
    }
    iterator operator++(int) {
      iterator old = *this;
      ++position_;
      return old;
    }
    friend bool operator==(const iterator& a, const iterator& b) {
      return a.position_ == b.position_;
    }

   private:
    friend class PointRange;
    iterator(const Shape* shape, size_t position) : shape_(shape), position_(position) {}
    const Shape* shape_ = nullptr;
    size_t position_ = 0;
  };

  explicit PointRange(Shape shape) : shape_(std::move(shape)) {}
  iterator begin() const { return iterator(&shape_, 0); }
  iterator end() const { return iterator(&shape_, shape_.size()); }
  size_t size() const { return shape_.size(); }

 private:
  Shape shape_;
};

std::ostream& operator<<(std::ostream& os, const Range& r);
std::ostream& operator<<(std::ostream& os, const Slice& s);
std::ostream& operator<<(std::ostream& os, const Shape& s);
std::ostream& operator<<(std::ostream& os, const Point& p);

}  // namespace castmesh
