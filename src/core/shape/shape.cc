// Slice/Shape/Point algebra. Pure value computations: no locks, no logging.
#include "castmesh/shape.h"

#include <algorithm>
#include <numeric>
#include <ostream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace castmesh {

namespace {

size_t product(const std::vector<size_t>& v) {
  return std::accumulate(v.begin(), v.end(), size_t{1}, std::multiplies<>());
}

// Dimension indices of size > 1 ordered by decreasing stride: the order in
// which a base rank is decomposed into coordinates by division.
std::vector<size_t> dims_by_decreasing_stride(const std::vector<size_t>& sizes,
                                              const std::vector<size_t>& strides) {
  std::vector<size_t> order;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > 1) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return strides[a] > strides[b]; });
  return order;
}

absl::Status validate_labels(const std::vector<std::string>& labels) {
  absl::flat_hash_set<std::string_view> seen;
  for (const std::string& label : labels) {
    if (label.empty()) return absl::InvalidArgumentError("a dimension name is empty");
    if (!seen.insert(label).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("dimension name '", label, "' appears twice"));
    }
  }
  return absl::OkStatus();
}

std::string join_sizes(const std::vector<size_t>& v) { return absl::StrJoin(v, ", "); }

// This abseil may be built with its own string_view, which StrCat accepts
// but std::string_view does not convert to.
absl::string_view text(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

// ---------------------------------------------------------------- Range

std::string Range::to_string() const {
  std::string stop_text = stop == kEnd ? "end" : absl::StrCat(stop);
  return absl::StrCat("Range(", start, ", ", stop_text, ", ", step, ")");
}

// ---------------------------------------------------------------- Slice

absl::StatusOr<Slice> Slice::Create(size_t offset, std::vector<size_t> sizes,
                                    std::vector<size_t> strides) {
  if (sizes.size() != strides.size()) {
    return absl::InvalidArgumentError(absl::StrCat("slice has ", sizes.size(), " sizes but ",
                                                   strides.size(), " strides"));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("slice dimension ", i, " has size 0"));
    }
    if (sizes[i] > 1 && strides[i] == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice dimension ", i, " of size ", sizes[i], " has stride 0"));
    }
  }
  // Strong non-overlap: visiting dimensions from the smallest stride up, each
  // stride must exceed everything reachable below it. This is what makes
  // coordinates() a simple division.
  std::vector<size_t> order = dims_by_decreasing_stride(sizes, strides);
  size_t reach = 0;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (strides[*it] <= reach) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice sizes [", join_sizes(sizes), "] strides [", join_sizes(strides),
                       "] map two coordinates to the same rank"));
    }
    reach += strides[*it] * (sizes[*it] - 1);
  }
  return Slice(offset, std::move(sizes), std::move(strides));
}

absl::StatusOr<Slice> Slice::RowMajor(std::vector<size_t> sizes) {
  std::vector<size_t> strides(sizes.size(), 1);
  for (size_t i = sizes.size(); i-- > 1;) strides[i - 1] = strides[i] * sizes[i];
  return Create(0, std::move(sizes), std::move(strides));
}

size_t Slice::size() const { return product(sizes_); }

absl::StatusOr<size_t> Slice::location(const std::vector<size_t>& coords) const {
  if (coords.size() != sizes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", sizes_.size(),
                                                   " coordinates, got ", coords.size()));
  }
  size_t rank = offset_;
  for (size_t i = 0; i < coords.size(); ++i) {
    if (coords[i] >= sizes_[i]) {
      return absl::OutOfRangeError(absl::StrCat("coordinate ", coords[i], " of dimension ", i,
                                                " is out of range (size ", sizes_[i], ")"));
    }
    rank += coords[i] * strides_[i];
  }
  return rank;
}

absl::StatusOr<std::vector<size_t>> Slice::coordinates(size_t rank) const {
  auto not_found = [&] {
    return absl::NotFoundError(absl::StrCat("rank ", rank, " is not in ", to_string()));
  };
  if (rank < offset_) return not_found();
  size_t rest = rank - offset_;
  std::vector<size_t> coords(sizes_.size(), 0);
  for (size_t d : dims_by_decreasing_stride(sizes_, strides_)) {
    coords[d] = rest / strides_[d];
    if (coords[d] >= sizes_[d]) return not_found();
    rest -= coords[d] * strides_[d];
  }
  if (rest != 0) return not_found();
  return coords;
}

absl::StatusOr<size_t> Slice::rank_at(size_t position) const {
  size_t n = size();
  if (position >= n) {
    return absl::OutOfRangeError(
        absl::StrCat("position ", position, " is out of range (slice of ", n, " ranks)"));
  }
  size_t rank = offset_;
  for (size_t i = sizes_.size(); i-- > 0;) {
    rank += (position % sizes_[i]) * strides_[i];
    position /= sizes_[i];
  }
  return rank;
}

absl::StatusOr<size_t> Slice::position_of(size_t rank) const {
  absl::StatusOr<std::vector<size_t>> coords = coordinates(rank);
  if (!coords.ok()) return coords.status();
  size_t position = 0;
  for (size_t i = 0; i < sizes_.size(); ++i) position = position * sizes_[i] + (*coords)[i];
  return position;
}

std::vector<size_t> Slice::ranks() const {
  size_t n = size();
  std::vector<size_t> out;
  out.reserve(n);
  // Odometer over the coordinates: no division per rank.
  std::vector<size_t> coords(sizes_.size(), 0);
  size_t rank = offset_;
  for (size_t k = 0; k < n; ++k) {
    out.push_back(rank);
    for (size_t i = sizes_.size(); i-- > 0;) {
      if (++coords[i] < sizes_[i]) {
        rank += strides_[i];
        break;
      }
      rank -= (sizes_[i] - 1) * strides_[i];
      coords[i] = 0;
    }
  }
  return out;
}

bool Slice::is_contiguous() const {
  size_t expected = 1;
  for (size_t i = sizes_.size(); i-- > 0;) {
    if (sizes_[i] > 1 && strides_[i] != expected) return false;
    expected *= sizes_[i];
  }
  return true;
}

absl::StatusOr<Slice> Slice::select(size_t dim, const Range& r) const {
  if (dim >= sizes_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dimension ", dim, " does not exist (slice has ", sizes_.size(), ")"));
  }
  const int64_t size = static_cast<int64_t>(sizes_[dim]);
  const int64_t stop = r.stop == Range::kEnd ? size : r.stop;
  if (r.step < 1) {
    return absl::InvalidArgumentError(absl::StrCat(r.to_string(), ": step must be >= 1"));
  }
  if (r.start < 0 || stop < 0) {
    return absl::OutOfRangeError(
        absl::StrCat(r.to_string(), ": negative indices are not supported"));
  }
  if (stop > size) {
    return absl::OutOfRangeError(
        absl::StrCat(r.to_string(), " goes past the end of a dimension of size ", size));
  }
  if (r.start >= stop) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.to_string(), " selects nothing from a dimension of size ", size));
  }
  std::vector<size_t> sizes = sizes_;
  std::vector<size_t> strides = strides_;
  // Not (stop - start + step - 1) / step: that overflows for a step near
  // INT64_MAX, which a Python slice such as [0:4:2**62] passes through.
  sizes[dim] = static_cast<size_t>((stop - r.start - 1) / r.step + 1);
  strides[dim] = sizes[dim] == 1 ? strides_[dim] : strides_[dim] * static_cast<size_t>(r.step);
  return Slice(offset_ + static_cast<size_t>(r.start) * strides_[dim], std::move(sizes),
               std::move(strides));
}

absl::StatusOr<Slice> Slice::at(size_t dim, int64_t index) const {
  if (dim >= sizes_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dimension ", dim, " does not exist (slice has ", sizes_.size(), ")"));
  }
  if (index < 0 || static_cast<size_t>(index) >= sizes_[dim]) {
    return absl::OutOfRangeError(
        absl::StrCat("index ", index, " is out of range for a dimension of size ", sizes_[dim]));
  }
  std::vector<size_t> sizes = sizes_;
  std::vector<size_t> strides = strides_;
  sizes.erase(sizes.begin() + static_cast<std::ptrdiff_t>(dim));
  strides.erase(strides.begin() + static_cast<std::ptrdiff_t>(dim));
  return Slice(offset_ + static_cast<size_t>(index) * strides_[dim], std::move(sizes),
               std::move(strides));
}

// The no-copy reshape of NumPy (_attempt_nocopy_reshape): walk old and new
// dimensions together, grouping them until their products match; each group
// of old dimensions must be mergeable (stride[k] == size[k+1]*stride[k+1]),
// then the new dimensions of the group get row-major strides ending in the
// group's innermost stride.
absl::StatusOr<Slice> Slice::reshape(const std::vector<size_t>& new_sizes) const {
  for (size_t s : new_sizes) {
    if (s == 0) return absl::InvalidArgumentError("reshape to a dimension of size 0");
  }
  if (product(new_sizes) != size()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot reshape ", size(), " ranks into [",
                                                   join_sizes(new_sizes), "]"));
  }
  // Size-1 dimensions carry no information: drop them from the old view.
  std::vector<size_t> old_sizes;
  std::vector<size_t> old_strides;
  for (size_t i = 0; i < sizes_.size(); ++i) {
    if (sizes_[i] != 1) {
      old_sizes.push_back(sizes_[i]);
      old_strides.push_back(strides_[i]);
    }
  }
  std::vector<size_t> new_strides(new_sizes.size(), 1);
  const size_t old_n = old_sizes.size();
  const size_t new_n = new_sizes.size();
  size_t oi = 0, oj = 1, ni = 0, nj = 1;
  while (ni < new_n && oi < old_n) {
    size_t np = new_sizes[ni];
    size_t op = old_sizes[oi];
    while (np != op) {
      if (np < op) {
        np *= new_sizes[nj++];
      } else {
        op *= old_sizes[oj++];
      }
    }
    for (size_t ok = oi; ok + 1 < oj; ++ok) {
      if (old_strides[ok] != old_sizes[ok + 1] * old_strides[ok + 1]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot view ", to_string(), " as [", join_sizes(new_sizes),
            "] without copying: the strides of the merged dimensions are not contiguous"));
      }
    }
    new_strides[nj - 1] = old_strides[oj - 1];
    for (size_t nk = nj - 1; nk > ni; --nk) new_strides[nk - 1] = new_strides[nk] * new_sizes[nk];
    ni = nj++;
    oi = oj++;
  }
  // Trailing new dimensions of size 1 (or all of them, for a 1-rank slice).
  size_t last_stride = ni > 0 ? new_strides[ni - 1] : 1;
  for (; ni < new_n; ++ni) new_strides[ni] = last_stride;
  return Slice(offset_, new_sizes, std::move(new_strides));
}

std::string Slice::to_string() const {
  return absl::StrCat("Slice(offset=", offset_, ", sizes=[", join_sizes(sizes_), "], strides=[",
                      join_sizes(strides_), "])");
}

// ---------------------------------------------------------------- Shape

struct Shape::Rep {
  std::vector<std::string> labels;
  Slice slice;
};

Shape::Shape() : rep_(std::make_shared<const Rep>()) {}

absl::StatusOr<Shape> Shape::Create(std::vector<std::pair<std::string, size_t>> dims) {
  std::vector<std::string> labels;
  std::vector<size_t> sizes;
  for (auto& [name, size] : dims) {
    if (size == 0) {
      return absl::InvalidArgumentError(absl::StrCat("dimension '", name, "' has size 0"));
    }
    labels.push_back(std::move(name));
    sizes.push_back(size);
  }
  absl::StatusOr<Slice> slice = Slice::RowMajor(std::move(sizes));
  if (!slice.ok()) return slice.status();
  return Create(std::move(labels), *std::move(slice));
}

absl::StatusOr<Shape> Shape::Create(std::vector<std::string> labels, Slice slice) {
  if (labels.size() != slice.ndim()) {
    return absl::InvalidArgumentError(absl::StrCat(labels.size(), " dimension names for a ",
                                                   slice.ndim(), "-dimensional slice"));
  }
  if (absl::Status s = validate_labels(labels); !s.ok()) return s;
  return Shape(std::make_shared<const Rep>(Rep{std::move(labels), std::move(slice)}));
}

const std::vector<std::string>& Shape::labels() const { return rep_->labels; }
const Slice& Shape::slice() const { return rep_->slice; }

absl::StatusOr<size_t> Shape::dim(std::string_view name) const {
  const auto& labels = rep_->labels;
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] == name) return i;
  }
  return absl::NotFoundError(absl::StrCat("unknown dimension '", text(name), "' (dimensions: ",
                                          labels.empty() ? "none" : absl::StrJoin(labels, ", "),
                                          ")"));
}

absl::StatusOr<size_t> Shape::size_of(std::string_view name) const {
  absl::StatusOr<size_t> d = dim(name);
  if (!d.ok()) return d.status();
  return sizes()[*d];
}

absl::StatusOr<Shape> Shape::select(std::string_view name, int64_t index) const {
  absl::StatusOr<size_t> d = dim(name);
  if (!d.ok()) return d.status();
  if (index < 0 || static_cast<size_t>(index) >= sizes()[*d]) {
    return absl::OutOfRangeError(absl::StrCat("index ", index, " is out of range for dimension '",
                                              text(name), "' of size ", sizes()[*d]));
  }
  absl::StatusOr<Slice> s = slice().at(*d, index);
  if (!s.ok()) return s.status();
  std::vector<std::string> labels = rep_->labels;
  labels.erase(labels.begin() + static_cast<std::ptrdiff_t>(*d));
  return Shape(std::make_shared<const Rep>(Rep{std::move(labels), *std::move(s)}));
}

absl::StatusOr<Shape> Shape::select(std::string_view name, const Range& range) const {
  absl::StatusOr<size_t> d = dim(name);
  if (!d.ok()) return d.status();
  absl::StatusOr<Slice> s = slice().select(*d, range);
  if (!s.ok()) {
    return absl::Status(s.status().code(),
                        absl::StrCat("dimension '", text(name), "': ", s.status().message()));
  }
  return Shape(std::make_shared<const Rep>(Rep{rep_->labels, *std::move(s)}));
}

absl::StatusOr<Shape> Shape::select(std::string_view name, const Selector& selector) const {
  return std::visit([&](const auto& sel) { return select(name, sel); }, selector);
}

namespace {

// Applies (name, selector) pairs one after the other; the first error wins.
template <typename Selections>
absl::StatusOr<Shape> select_each(Shape current, const Selections& selections) {
  for (const auto& [name, selector] : selections) {
    absl::StatusOr<Shape> next = current.select(name, selector);
    if (!next.ok()) return next.status();
    current = *std::move(next);
  }
  return current;
}

}  // namespace

absl::StatusOr<Shape> Shape::select(
    std::initializer_list<std::pair<std::string_view, Selector>> selections) const {
  return select_each(*this, selections);
}

absl::StatusOr<Shape> Shape::select(
    const std::vector<std::pair<std::string, Selector>>& selections) const {
  return select_each(*this, selections);
}

absl::StatusOr<Shape> Shape::flatten(std::string name) const {
  return reshape({{std::move(name), size()}});
}

absl::StatusOr<Shape> Shape::reshape(std::vector<std::pair<std::string, size_t>> dims) const {
  std::vector<std::string> labels;
  std::vector<size_t> sizes;
  for (auto& [name, size] : dims) {
    labels.push_back(std::move(name));
    sizes.push_back(size);
  }
  if (absl::Status st = validate_labels(labels); !st.ok()) return st;
  absl::StatusOr<Slice> s = slice().reshape(sizes);
  if (!s.ok()) return s.status();
  return Shape(std::make_shared<const Rep>(Rep{std::move(labels), *std::move(s)}));
}

absl::StatusOr<Point> Shape::point_of_coords(absl::Span<const size_t> coords) const {
  if (coords.size() != ndim()) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", to_string(), " needs ", ndim(),
                                                   " coordinates, got ", coords.size()));
  }
  size_t position = 0;
  for (size_t i = 0; i < coords.size(); ++i) {
    if (coords[i] >= sizes()[i]) {
      return absl::OutOfRangeError(absl::StrCat("coordinate ", coords[i], " is out of range for dimension '",
                                                labels()[i], "' of size ", sizes()[i]));
    }
    position = position * sizes()[i] + coords[i];
  }
  std::vector<size_t> owned(coords.begin(), coords.end());
  absl::StatusOr<size_t> rank = slice().location(owned);
  if (!rank.ok()) return rank.status();
  return Point(*this, std::move(owned), position, *rank);
}

absl::StatusOr<Point> Shape::point(
    const std::vector<std::pair<std::string, size_t>>& named_coords) const {
  std::vector<size_t> coords(ndim(), 0);
  std::vector<bool> given(ndim(), false);
  for (const auto& [name, value] : named_coords) {
    absl::StatusOr<size_t> d = dim(name);
    if (!d.ok()) return d.status();
    if (given[*d]) {
      return absl::InvalidArgumentError(absl::StrCat("dimension '", name, "' given twice"));
    }
    given[*d] = true;
    coords[*d] = value;
  }
  for (size_t i = 0; i < ndim(); ++i) {
    if (!given[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("no coordinate given for dimension '", labels()[i], "'"));
    }
  }
  return point_of_coords(coords);
}

absl::StatusOr<Point> Shape::point_at(size_t position) const {
  if (position >= size()) {
    return absl::OutOfRangeError(absl::StrCat("position ", position, " is out of range for shape ",
                                              to_string(), " of ", size(), " points"));
  }
  std::vector<size_t> coords(ndim(), 0);
  size_t rest = position;
  for (size_t i = ndim(); i-- > 0;) {
    coords[i] = rest % sizes()[i];
    rest /= sizes()[i];
  }
  absl::StatusOr<size_t> rank = slice().location(coords);
  if (!rank.ok()) return rank.status();
  return Point(*this, std::move(coords), position, *rank);
}

absl::StatusOr<Point> Shape::point_of_rank(size_t rank) const {
  absl::StatusOr<size_t> position = slice().position_of(rank);
  if (!position.ok()) {
    return absl::NotFoundError(absl::StrCat("rank ", rank, " is not in shape ", to_string()));
  }
  return point_at(*position);
}

PointRange Shape::points() const { return PointRange(*this); }

std::string Shape::to_string() const {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ndim(); ++i) parts.push_back(absl::StrCat(labels()[i], "=", sizes()[i]));
  std::string out = absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
  if (!slice().is_contiguous() || slice().offset() != 0) {
    absl::StrAppend(&out, " over ", slice().to_string());
  }
  return out;
}

bool operator==(const Shape& a, const Shape& b) {
  return a.rep_ == b.rep_ || (a.labels() == b.labels() && a.slice() == b.slice());
}

// ---------------------------------------------------------------- Point

absl::StatusOr<size_t> Point::coord(std::string_view name) const {
  absl::StatusOr<size_t> d = shape_.dim(name);
  if (!d.ok()) return d.status();
  return coords_[*d];
}

std::string Point::to_string() const {
  std::vector<std::string> parts;
  for (size_t i = 0; i < coords_.size(); ++i) {
    parts.push_back(absl::StrCat(shape_.labels()[i], "=", coords_[i]));
  }
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

Point PointRange::iterator::operator*() const {
  // position_ < size() for any dereferenceable iterator, so this cannot fail.
  return *shape_->point_at(position_);
}

std::ostream& operator<<(std::ostream& os, const Range& r) { return os << r.to_string(); }
std::ostream& operator<<(std::ostream& os, const Slice& s) { return os << s.to_string(); }
std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.to_string(); }
std::ostream& operator<<(std::ostream& os, const Point& p) { return os << p.to_string(); }

}  // namespace castmesh
