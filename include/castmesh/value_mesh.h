// ValueMesh<T>: one value per point of a Shape (the replies of a mesh call),
// and Reducer<T>: how to fold such values into one.
//
// A ValueMesh is a plain value type (copyable, movable). Like a std::vector,
// concurrent reads are safe and writes need external synchronisation.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <iterator>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "castmesh/message.h"
#include "castmesh/shape.h"

namespace castmesh {

// An associative binary operation over T, used to fold the values of a mesh
// (locally with ValueMesh::reduce, or on the way back up the cast tree with
// ActorMesh::call(msg, reducer)). Values are always combined in row-major
// order of the points (left operand first), so the operation needs to be
// associative but not commutative. `name` is for logs and errors.
//
// `registered`: the reducer is registered under `name` for T in every proc
// of this binary (the built-in sum/min/max of arithmetic types and
// std::string, or CASTMESH_REGISTER_REDUCER), so the cast relays of other
// procs can fold with it on the way back. An unregistered reducer (e.g.
// reducers::custom with a lambda) still works: the values travel up
// unfolded and the caller folds them (docs/meshes.md).
template <typename T>
struct Reducer {
  std::string name;
  std::function<T(T, T)> combine;
  bool registered = false;
};

namespace detail {

// Folds two encoded values of one type into one encoded value.
using EncodedFold = std::function<absl::StatusOr<std::string>(std::string_view, std::string_view)>;

// The registry of reducers that other procs can use, by (name, C++ type
// name). Thread-safe; registration is meant for static initialisation (a
// second registration of a key keeps the first). `typed` points at the
// std::function<T(T, T)> of the reducer (for reducers::registered).
void register_reducer_entry(std::string name, std::string value_type, std::shared_ptr<const void> typed,
                            EncodedFold fold);
// The typed combine function (a std::function<T(T, T)>) registered under
// (name, value_type), or nullptr.
std::shared_ptr<const void> find_reducer_combine(std::string_view name, std::string_view value_type);
// The encoded fold registered under (name, value_type), or nullptr. The
// pointer stays valid for the life of the process.
const EncodedFold* find_encoded_fold(std::string_view name, std::string_view value_type);

template <typename T, typename F>
bool register_reducer_as(std::string name, F combine) {
  auto typed = std::make_shared<const std::function<T(T, T)>>(std::move(combine));
  EncodedFold fold = [typed](std::string_view a, std::string_view b) -> absl::StatusOr<std::string> {
    T x{}, y{};
    if (absl::Status st = decode_value(a, &x); !st.ok()) return st;
    if (absl::Status st = decode_value(b, &y); !st.ok()) return st;
    std::string out;
    if (absl::Status st = encode_value((*typed)(std::move(x), std::move(y)), &out); !st.ok()) return st;
    return out;
  };
  register_reducer_entry(std::move(name), std::string(type_name<T>()), typed, std::move(fold));
  return true;
}

// Registers sum/min/max for T at static initialisation of every binary
// that uses them (so worker procs, re-executions of the same binary, know
// them too). Only for types with built-in codecs.
template <typename T>
inline constexpr bool kBuiltinReducible = std::is_arithmetic_v<T> || std::is_same_v<T, std::string>;

template <typename T>
inline const bool builtin_reducers_registered = [] {
  if constexpr (kBuiltinReducible<T>) {
    register_reducer_as<T>("sum", [](T a, T b) { return a + b; });
    register_reducer_as<T>("min", [](T a, T b) { return b < a ? b : a; });
    register_reducer_as<T>("max", [](T a, T b) { return a < b ? b : a; });
  }
  return kBuiltinReducible<T>;
}();

}  // namespace detail

// Registers `combine` (an associative T(T, T)) as the reducer `name` over
// Type, in every proc of this binary; get it with
// reducers::registered<Type>(name). At namespace scope in a .cc file linked
// into every proc: CASTMESH_REGISTER_REDUCER(Stats, "merge", merge_stats);
#define CASTMESH_REGISTER_REDUCER(Type, name, combine)                                                     \
  static const bool CASTMESH_DETAIL_REDUCER_CONCAT(castmesh_reducer_registered_, __LINE__) [[maybe_unused]] = \
      ::castmesh::detail::register_reducer_as<Type>(name, combine)
#define CASTMESH_DETAIL_REDUCER_CONCAT2(a, b) a##b
#define CASTMESH_DETAIL_REDUCER_CONCAT(a, b) CASTMESH_DETAIL_REDUCER_CONCAT2(a, b)

namespace reducers {

// Built-in reducers; registered (foldable in other procs) for arithmetic
// types and std::string.
template <typename T>
Reducer<T> sum() {
  return {"sum", [](T a, T b) { return a + b; }, detail::builtin_reducers_registered<T>};
}
template <typename T>
Reducer<T> min() {
  return {"min", [](T a, T b) { return b < a ? b : a; }, detail::builtin_reducers_registered<T>};
}
template <typename T>
Reducer<T> max() {
  return {"max", [](T a, T b) { return a < b ? b : a; }, detail::builtin_reducers_registered<T>};
}
// A user-defined reduction; `combine(a, b)` must be associative. Not
// registered: across procs the caller folds the values.
template <typename T, typename F>
Reducer<T> custom(std::string name, F combine) {
  return {std::move(name), std::function<T(T, T)>(std::move(combine)), false};
}
// The reducer registered as `name` over T with CASTMESH_REGISTER_REDUCER
// (or a built-in one). Errors: NotFound.
template <typename T>
absl::StatusOr<Reducer<T>> registered(std::string_view name) {
  (void)detail::builtin_reducers_registered<T>;
  std::shared_ptr<const void> typed = detail::find_reducer_combine(name, type_name<T>());
  if (typed == nullptr) {
    return absl::NotFoundError(absl::StrCat("no reducer '", std::string(name), "' registered for ", std::string(type_name<T>()),
                                            " (CASTMESH_REGISTER_REDUCER)"));
  }
  return Reducer<T>{std::string(name), *static_cast<const std::function<T(T, T)>*>(typed.get()), true};
}

}  // namespace reducers

template <typename T>
class ValueMesh {
 public:
  using value_type = T;
  using const_iterator = typename std::vector<T>::const_iterator;
  using iterator = typename std::vector<T>::iterator;

  // Values in row-major order of the shape's points. Errors: the number of
  // values differs from shape.size().
  static absl::StatusOr<ValueMesh> Create(Shape shape, std::vector<T> values) {
    if (values.size() != shape.size()) {
      return absl::InvalidArgumentError(absl::StrCat("a ValueMesh over ", shape.to_string(),
                                                     " needs ", shape.size(), " values, got ",
                                                     values.size()));
    }
    return ValueMesh(std::move(shape), std::move(values));
  }
  // Every point holds a copy of `value`.
  static ValueMesh Filled(Shape shape, const T& value) {
    size_t n = shape.size();
    return ValueMesh(std::move(shape), std::vector<T>(n, value));
  }

  const Shape& shape() const { return shape_; }
  size_t size() const { return values_.size(); }
  // The values in row-major order of the points.
  const std::vector<T>& values() const { return values_; }

  // Unchecked access by a point of shape() (precondition: `p` was obtained
  // from shape() or an equal shape). Use at() for anything else.
  const T& operator[](const Point& p) const { return values_[p.position()]; }
  T& operator[](const Point& p) { return values_[p.position()]; }

  // Checked access by point. A point of another shape is accepted when its
  // base rank is in this mesh (e.g. a point of the parent mesh); NotFound
  // otherwise.
  absl::StatusOr<T> at(const Point& p) const {
    if (p.shape() == shape_) return values_[p.position()];
    absl::StatusOr<size_t> position = shape_.slice().position_of(p.rank());
    if (!position.ok()) {
      return absl::NotFoundError(absl::StrCat("point ", p.to_string(), " (rank ", p.rank(),
                                              ") is not in this ValueMesh over ",
                                              shape_.to_string()));
    }
    return values_[*position];
  }
  // Checked access by coordinates (one per dimension, in order).
  absl::StatusOr<T> at_coords(absl::Span<const size_t> coords) const {
    absl::StatusOr<Point> p = shape_.point_of_coords(coords);
    if (!p.ok()) return p.status();
    return values_[p->position()];
  }
  // Checked access by named coordinates, e.g. at({{"hosts", 1}, {"gpus", 2}}).
  absl::StatusOr<T> at(const std::vector<std::pair<std::string, size_t>>& named) const {
    absl::StatusOr<Point> p = shape_.point(named);
    if (!p.ok()) return p.status();
    return values_[p->position()];
  }

  // Iteration over the values in row-major order.
  const_iterator begin() const { return values_.begin(); }
  const_iterator end() const { return values_.end(); }
  iterator begin() { return values_.begin(); }
  iterator end() { return values_.end(); }

  // Iteration over (point, value) pairs in row-major order:
  //   for (const auto& [point, value] : mesh.items()) ...
  class ItemRange {
   public:
    class iterator {
     public:
      using iterator_category = std::input_iterator_tag;
      using value_type = std::pair<Point, const T&>;
      using difference_type = std::ptrdiff_t;
      using reference = value_type;
      using pointer = void;

      iterator() = default;
      value_type operator*() const {
        return value_type(*mesh_->shape_.point_at(position_), mesh_->values_[position_]);
      }
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
      friend class ItemRange;
      iterator(const ValueMesh* mesh, size_t position) : mesh_(mesh), position_(position) {}
      const ValueMesh* mesh_ = nullptr;
      size_t position_ = 0;
    };
    iterator begin() const { return iterator(mesh_, 0); }
    iterator end() const { return iterator(mesh_, mesh_->size()); }

   private:
    friend class ValueMesh;
    explicit ItemRange(const ValueMesh* mesh) : mesh_(mesh) {}
    const ValueMesh* mesh_;
  };
  // Valid while this ValueMesh is alive and unmodified.
  ItemRange items() const { return ItemRange(this); }

  // A new mesh over the same shape with f(value) at each point.
  template <typename F>
  auto map(F&& f) const -> ValueMesh<std::decay_t<std::invoke_result_t<F&, const T&>>> {
    using U = std::decay_t<std::invoke_result_t<F&, const T&>>;
    std::vector<U> out;
    out.reserve(values_.size());
    for (const T& v : values_) out.push_back(f(v));
    return *ValueMesh<U>::Create(shape_, std::move(out));
  }

  // Folds every value in row-major order. A ValueMesh is never empty (a
  // Shape has at least one point), so this always has a result.
  T reduce(const Reducer<T>& reducer) const {
    T acc = values_.front();
    for (size_t i = 1; i < values_.size(); ++i) acc = reducer.combine(std::move(acc), values_[i]);
    return acc;
  }

  // The values of a sub-shape of this mesh's shape (e.g. from
  // shape().select(...)), without touching the others. Errors: a point of
  // `sub` that is not in this mesh.
  absl::StatusOr<ValueMesh> restrict_to(const Shape& sub) const {
    std::vector<T> out;
    out.reserve(sub.size());
    for (size_t rank : sub.slice().ranks()) {
      absl::StatusOr<size_t> position = shape_.slice().position_of(rank);
      if (!position.ok()) {
        return absl::NotFoundError(absl::StrCat("rank ", rank, " of ", sub.to_string(),
                                                " is not in this ValueMesh over ",
                                                shape_.to_string()));
      }
      out.push_back(values_[*position]);
    }
    return ValueMesh(sub, std::move(out));
  }
  // restrict_to(shape().select(name, selector)).
  absl::StatusOr<ValueMesh> select(std::string_view name, const Selector& selector) const {
    absl::StatusOr<Shape> sub = shape_.select(name, selector);
    if (!sub.ok()) return sub.status();
    return restrict_to(*sub);
  }

  friend bool operator==(const ValueMesh& a, const ValueMesh& b) {
    return a.shape_ == b.shape_ && a.values_ == b.values_;
  }

 private:
  ValueMesh(Shape shape, std::vector<T> values)
      : shape_(std::move(shape)), values_(std::move(values)) {}

  Shape shape_;
  std::vector<T> values_;
};

}  // namespace castmesh
