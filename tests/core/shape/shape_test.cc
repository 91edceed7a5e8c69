// Slice/Shape/Point algebra: examples, errors, and property tests against a
// brute-force model (explicit lists of ranks).
#include "castmesh/shape.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <set>
#include <sstream>

namespace castmesh {
namespace {

Shape make_shape(std::vector<std::pair<std::string, size_t>> dims) {
  absl::StatusOr<Shape> s = Shape::Create(std::move(dims));
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

std::vector<size_t> ranks_of(const Shape& s) { return s.slice().ranks(); }

TEST(Shape, RowMajorRanksAndPoints) {
  Shape s = make_shape({{"hosts", 2}, {"gpus", 4}});
  EXPECT_EQ(s.size(), 8u);
  EXPECT_EQ(s.ndim(), 2u);
  EXPECT_EQ(s.to_string(), "{hosts=2, gpus=4}");
  EXPECT_EQ(ranks_of(s), (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  absl::StatusOr<Point> p = s.point({{"gpus", 3}, {"hosts", 1}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->rank(), 7u);
  EXPECT_EQ(p->position(), 7u);
  EXPECT_EQ(p->to_string(), "{hosts=1, gpus=3}");
  EXPECT_EQ(*p->coord("gpus"), 3u);
  EXPECT_EQ(p->coord("nodes").status().code(), absl::StatusCode::kNotFound);
}

TEST(Shape, SelectIndexDropsDimension) {
  Shape s = make_shape({{"hosts", 2}, {"gpus", 4}});
  absl::StatusOr<Shape> g1 = s.select("gpus", 1);
  ASSERT_TRUE(g1.ok()) << g1.status();
  EXPECT_EQ(g1->labels(), std::vector<std::string>{"hosts"});
  EXPECT_EQ(ranks_of(*g1), (std::vector<size_t>{1, 5}));
  absl::StatusOr<Shape> h1 = s.select("hosts", 1);
  ASSERT_TRUE(h1.ok());
  EXPECT_EQ(ranks_of(*h1), (std::vector<size_t>{4, 5, 6, 7}));
  // Selecting every dimension leaves a 0-dimensional shape of one point.
  absl::StatusOr<Shape> one = h1->select("gpus", 2);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->ndim(), 0u);
  EXPECT_EQ(one->size(), 1u);
  EXPECT_EQ(ranks_of(*one), std::vector<size_t>{6});
  EXPECT_EQ(one->point_at(0)->to_string(), "{}");
}

TEST(Shape, SelectRangeAndStepKeepDimension) {
  Shape s = make_shape({{"hosts", 2}, {"gpus", 4}});
  absl::StatusOr<Shape> even = s.select("gpus", Range(0, 4, 2));
  ASSERT_TRUE(even.ok()) << even.status();
  EXPECT_EQ(even->sizes(), (std::vector<size_t>{2, 2}));
  EXPECT_EQ(ranks_of(*even), (std::vector<size_t>{0, 2, 4, 6}));
  absl::StatusOr<Shape> tail = s.select("gpus", Range::from(1));
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(ranks_of(*tail), (std::vector<size_t>{1, 2, 3, 5, 6, 7}));
  absl::StatusOr<Shape> odd = s.select("gpus", Range(1, Range::kEnd, 2));
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(ranks_of(*odd), (std::vector<size_t>{1, 3, 5, 7}));
  absl::StatusOr<Shape> both = s.select({{"hosts", 1}, {"gpus", Range::every(3)}});
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(ranks_of(*both), (std::vector<size_t>{4, 7}));
}

TEST(Shape, ClearErrors) {
  Shape s = make_shape({{"hosts", 2}, {"gpus", 4}});
  absl::Status unknown = s.select("gpu", 1).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.message().find("unknown dimension 'gpu'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.message().find("hosts, gpus"), std::string::npos) << unknown;

  absl::Status out = s.select("gpus", 4).status();
  EXPECT_EQ(out.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(out.message().find("index 4"), std::string::npos) << out;
  EXPECT_NE(out.message().find("'gpus' of size 4"), std::string::npos) << out;
  EXPECT_EQ(s.select("gpus", -1).status().code(), absl::StatusCode::kOutOfRange);

  EXPECT_EQ(s.select("gpus", Range(0, 5)).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s.select("gpus", Range(2, 2)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.select("gpus", Range(0, 4, 0)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.select("gpus", Range(-1, 2)).status().code(), absl::StatusCode::kOutOfRange);
  absl::Status range_err = s.select("gpus", Range(3, 9)).status();
  EXPECT_NE(range_err.message().find("dimension 'gpus'"), std::string::npos) << range_err;

  EXPECT_EQ(Shape::Create({{"a", 2}, {"a", 3}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Shape::Create({{"", 2}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Shape::Create({{"a", 0}}).status().code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(s.point_of_coords({2, 0}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s.point_of_coords({0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.point({{"hosts", 0}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.point({{"hosts", 0}, {"hosts", 1}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.point({{"hosts", 0}, {"nope", 1}}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.point_at(8).status().code(), absl::StatusCode::kOutOfRange);
  Shape odd = *s.select("gpus", Range(1, 4, 2));
  EXPECT_EQ(odd.point_of_rank(2).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(odd.point_of_rank(100).status().code(), absl::StatusCode::kNotFound);
}

// What the Python bindings pass after normalising a Python slice: explicit
// bounds within the dimension and any positive step, however large.
TEST(Shape, SelectRangeTakesPythonNormalisedBounds) {
  Shape s = make_shape({{"hosts", 2}, {"gpus", 4}});
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  absl::StatusOr<Shape> first = s.select("gpus", Range(0, 4, kHuge));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(ranks_of(*first), (std::vector<size_t>{0, 4}));
  absl::StatusOr<Shape> last = s.select("gpus", Range(3, Range::kEnd, kHuge - 1));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(ranks_of(*last), (std::vector<size_t>{3, 7}));
  // range(4)[0:-1] == range(0, 3): the binding passes stop 3, never -1.
  absl::StatusOr<Shape> all_but_last = s.select("gpus", Range(0, 3));
  ASSERT_TRUE(all_but_last.ok());
  EXPECT_EQ(ranks_of(*all_but_last), (std::vector<size_t>{0, 1, 2, 4, 5, 6}));
  // Exhaustively: every (start, stop, step) in bounds selects range(start, stop, step).
  for (int64_t start = 0; start < 4; ++start) {
    for (int64_t stop = start + 1; stop <= 4; ++stop) {
      for (int64_t step = 1; step <= 5; ++step) {
        absl::StatusOr<Shape> got = s.select("hosts", 0)->select("gpus", Range(start, stop, step));
        ASSERT_TRUE(got.ok()) << got.status();
        std::vector<size_t> want;
        for (int64_t i = start; i < stop; i += step) want.push_back(static_cast<size_t>(i));
        EXPECT_EQ(ranks_of(*got), want) << start << ":" << stop << ":" << step;
      }
    }
  }
  // A negative stop is an error naming the problem, never "to the end".
  absl::Status negative = s.select("gpus", Range(0, -1)).status();
  EXPECT_EQ(negative.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(negative.message().find("negative"), std::string::npos) << negative;
  EXPECT_EQ(s.select("gpus", Range(3, 0, -1)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Slice, CreateRejectsOverlapsAndBadInput) {
  EXPECT_FALSE(Slice::Create(0, {2, 2}, {1, 1}).ok());  // ranks 0,1,1,2
  EXPECT_FALSE(Slice::Create(0, {3, 2}, {1, 2}).ok());  // 0,2,1,3,2,4
  EXPECT_FALSE(Slice::Create(0, {2}, {0}).ok());
  EXPECT_FALSE(Slice::Create(0, {2, 0}, {1, 1}).ok());
  EXPECT_FALSE(Slice::Create(0, {2}, {1, 1}).ok());
  // Column-major and gapped-but-disjoint slices are fine.
  absl::StatusOr<Slice> col = Slice::Create(0, {2, 3}, {1, 2});
  ASSERT_TRUE(col.ok()) << col.status();
  EXPECT_EQ(col->ranks(), (std::vector<size_t>{0, 2, 4, 1, 3, 5}));
  EXPECT_EQ(*col->coordinates(3), (std::vector<size_t>{1, 1}));
  absl::StatusOr<Slice> gapped = Slice::Create(10, {2, 2}, {3, 2});
  ASSERT_TRUE(gapped.ok());
  EXPECT_EQ(gapped->ranks(), (std::vector<size_t>{10, 12, 13, 15}));
  EXPECT_EQ(gapped->position_of(13).value(), 2u);
  EXPECT_EQ(gapped->coordinates(11).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(gapped->coordinates(9).status().code(), absl::StatusCode::kNotFound);
}

TEST(Shape, FlattenAndReshapeWithoutCopy) {
  Shape s = make_shape({{"hosts", 2}, {"gpus", 4}});
  absl::StatusOr<Shape> flat = s.flatten("all");
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(flat->sizes(), std::vector<size_t>{8});
  EXPECT_EQ(ranks_of(*flat), ranks_of(s));

  absl::StatusOr<Shape> r = s.reshape({{"x", 4}, {"y", 2}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ranks_of(*r), ranks_of(s));
  EXPECT_EQ(r->point({{"x", 3}, {"y", 0}})->rank(), 6u);

  // One host's gpus are contiguous: flattening works and keeps the offset.
  Shape host1 = *s.select("hosts", 1);
  EXPECT_EQ(ranks_of(*host1.flatten("g")), (std::vector<size_t>{4, 5, 6, 7}));
  // A step selection can be split but not merged with its neighbour.
  Shape even = *s.select("gpus", Range::every(2));  // ranks 0 2 4 6, strides 4, 2
  absl::StatusOr<Shape> even_flat = even.flatten("g");
  ASSERT_TRUE(even_flat.ok()) << even_flat.status();  // 0 2 4 6 is stride 2
  EXPECT_EQ(ranks_of(*even_flat), (std::vector<size_t>{0, 2, 4, 6}));
  Shape three = *s.select("gpus", Range(0, 3));  // 0 1 2 4 5 6
  absl::Status no_copy = three.flatten("g").status();
  EXPECT_EQ(no_copy.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(no_copy.message().find("without copying"), std::string::npos) << no_copy;
  // Splitting a strided dimension is always possible.
  Shape big = make_shape({{"a", 2}, {"b", 8}});
  Shape stepped = *big.select("b", Range::every(2));  // b: 4 entries stride 2
  absl::StatusOr<Shape> split = stepped.reshape({{"a", 2}, {"b0", 2}, {"b1", 2}});
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(ranks_of(*split), ranks_of(stepped));

  EXPECT_EQ(s.reshape({{"x", 3}, {"y", 3}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.reshape({{"x", 8}, {"x", 1}}).status().code(), absl::StatusCode::kInvalidArgument);
  // Size-1 dimensions may be inserted anywhere.
  absl::StatusOr<Shape> ones = s.reshape({{"u", 1}, {"h", 2}, {"v", 1}, {"g", 4}, {"w", 1}});
  ASSERT_TRUE(ones.ok()) << ones.status();
  EXPECT_EQ(ranks_of(*ones), ranks_of(s));
}

TEST(Shape, PointsIterateInRowMajorOrder) {
  Shape s = *make_shape({{"a", 3}, {"b", 2}}).select("a", Range(1, 3));
  std::vector<std::string> seen;
  std::vector<size_t> ranks;
  for (const Point& p : s.points()) {
    seen.push_back(p.to_string());
    ranks.push_back(p.rank());
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"{a=0, b=0}", "{a=0, b=1}", "{a=1, b=0}",
                                            "{a=1, b=1}"}));
  EXPECT_EQ(ranks, (std::vector<size_t>{2, 3, 4, 5}));
  std::ostringstream os;
  os << s;
  EXPECT_EQ(os.str(), s.to_string());
  EXPECT_NE(os.str().find("offset=2"), std::string::npos) << os.str();
}

// ------------------------------------------------------------ properties

// The brute-force model of a view: its sizes and its ranks in row-major order.
struct Model {
  std::vector<size_t> sizes;
  std::vector<size_t> ranks;
};

std::vector<size_t> unravel(size_t position, const std::vector<size_t>& sizes) {
  std::vector<size_t> c(sizes.size());
  for (size_t i = sizes.size(); i-- > 0;) {
    c[i] = position % sizes[i];
    position /= sizes[i];
  }
  return c;
}
size_t ravel(const std::vector<size_t>& c, const std::vector<size_t>& sizes) {
  size_t p = 0;
  for (size_t i = 0; i < sizes.size(); ++i) p = p * sizes[i] + c[i];
  return p;
}

Model model_select(const Model& m, size_t dim, int64_t start, int64_t stop, int64_t step) {
  Model out;
  out.sizes = m.sizes;
  out.sizes[dim] = static_cast<size_t>((stop - start + step - 1) / step);
  size_t n = 1;
  for (size_t s : out.sizes) n *= s;
  for (size_t p = 0; p < n; ++p) {
    std::vector<size_t> c = unravel(p, out.sizes);
    c[dim] = static_cast<size_t>(start) + c[dim] * static_cast<size_t>(step);
    out.ranks.push_back(m.ranks[ravel(c, m.sizes)]);
  }
  return out;
}

Model model_at(const Model& m, size_t dim, size_t index) {
  Model sel = model_select(m, dim, static_cast<int64_t>(index), static_cast<int64_t>(index) + 1, 1);
  sel.sizes.erase(sel.sizes.begin() + static_cast<std::ptrdiff_t>(dim));
  return sel;
}

class ShapeProperty : public ::testing::TestWithParam<uint32_t> {};

// "<prefix><i>". Built by appending: GCC 12 at -O2/-O3 reports a false
// -Wrestrict inside `"literal" + std::to_string(i)` (std::string::insert).
std::string indexed_name(const char* prefix, size_t i) {
  std::string name = prefix;
  name += std::to_string(i);
  return name;
}

// Random shapes and random chains of selections: the slice algebra agrees
// with the explicit model, and point <-> rank <-> position round-trip.
TEST_P(ShapeProperty, SelectionsMatchModelAndRoundTrip) {
  std::mt19937 rng(GetParam());
  auto uniform = [&](size_t lo, size_t hi) {
    return std::uniform_int_distribution<size_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<std::pair<std::string, size_t>> dims;
    size_t ndim = uniform(1, 4);
    for (size_t i = 0; i < ndim; ++i) dims.emplace_back(indexed_name("d", i), uniform(1, 5));
    Shape shape = make_shape(dims);
    Model model;
    for (auto& d : dims) model.sizes.push_back(d.second);
    for (size_t r = 0; r < shape.size(); ++r) model.ranks.push_back(r);

    size_t steps = uniform(0, 4);
    for (size_t k = 0; k < steps && shape.ndim() > 0; ++k) {
      size_t d = uniform(0, shape.ndim() - 1);
      const std::string label = shape.labels()[d];
      size_t size = shape.sizes()[d];
      if (uniform(0, 2) == 0) {
        size_t index = uniform(0, size - 1);
        absl::StatusOr<Shape> next = shape.select(label, static_cast<int64_t>(index));
        ASSERT_TRUE(next.ok()) << next.status();
        shape = *next;
        model = model_at(model, d, index);
      } else {
        int64_t start = static_cast<int64_t>(uniform(0, size - 1));
        int64_t stop = static_cast<int64_t>(uniform(static_cast<size_t>(start) + 1, size));
        int64_t step = static_cast<int64_t>(uniform(1, 3));
        absl::StatusOr<Shape> next = shape.select(label, Range(start, stop, step));
        ASSERT_TRUE(next.ok()) << next.status();
        shape = *next;
        model = model_select(model, d, start, stop, step);
      }
      ASSERT_EQ(shape.sizes(), model.sizes);
      ASSERT_EQ(shape.slice().ranks(), model.ranks) << shape.to_string();
      // A derived slice still satisfies Create's invariant.
      ASSERT_TRUE(Slice::Create(shape.slice().offset(), shape.sizes(), shape.slice().strides()).ok())
          << shape.to_string();
    }

    std::set<size_t> members(model.ranks.begin(), model.ranks.end());
    ASSERT_EQ(members.size(), model.ranks.size()) << "two points share a rank";
    size_t position = 0;
    for (const Point& p : shape.points()) {
      ASSERT_EQ(p.position(), position);
      ASSERT_EQ(p.rank(), model.ranks[position]);
      ASSERT_EQ(*shape.slice().rank_at(position), p.rank());
      ASSERT_EQ(*shape.slice().coordinates(p.rank()), p.coords());
      ASSERT_EQ(*shape.slice().location(p.coords()), p.rank());
      absl::StatusOr<Point> back = shape.point_of_rank(p.rank());
      ASSERT_TRUE(back.ok()) << back.status();
      ASSERT_EQ(*back, p);
      ASSERT_EQ(*shape.point_of_coords(p.coords()), p);
      ++position;
    }
    // Ranks around the view that are not members are reported as NotFound.
    size_t top = model.ranks.empty() ? 0 : *members.rbegin() + 2;
    for (size_t r = 0; r < top; ++r) {
      if (!members.count(r)) {
        ASSERT_EQ(shape.point_of_rank(r).status().code(), absl::StatusCode::kNotFound) << r;
      }
    }
  }
}

// A slice of a slice equals the direct slice with composed ranges.
TEST_P(ShapeProperty, SliceOfSliceEqualsDirectSlice) {
  std::mt19937 rng(GetParam() + 1000);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 100; ++trial) {
    int64_t n = uniform(1, 12);
    Shape shape = make_shape({{"a", 3}, {"b", static_cast<size_t>(n)}});
    int64_t s1 = uniform(0, n - 1), e1 = uniform(s1 + 1, n), k1 = uniform(1, 4);
    Shape first = *shape.select("b", Range(s1, e1, k1));
    int64_t m = static_cast<int64_t>(*first.size_of("b"));
    int64_t s2 = uniform(0, m - 1), e2 = uniform(s2 + 1, m), k2 = uniform(1, 3);
    Shape second = *first.select("b", Range(s2, e2, k2));
    int64_t direct_start = s1 + s2 * k1;
    int64_t direct_stop = s1 + (e2 - 1) * k1 + 1;
    Shape direct = *shape.select("b", Range(direct_start, direct_stop, k1 * k2));
    ASSERT_EQ(second.slice().ranks(), direct.slice().ranks());
    ASSERT_EQ(second.sizes(), direct.sizes());
    // Index selection through a slice equals the direct index.
    int64_t i = uniform(0, *second.size_of("b") - 1);
    ASSERT_EQ(second.select("b", i)->slice().ranks(),
              shape.select("b", direct_start + i * k1 * k2)->slice().ranks());
  }
}

// Reshape of any view either keeps exactly the same ranks in the same order,
// or fails with FailedPrecondition; on a contiguous view it always succeeds.
TEST_P(ShapeProperty, ReshapeKeepsRankOrder) {
  std::mt19937 rng(GetParam() + 2000);
  auto uniform = [&](size_t lo, size_t hi) {
    return std::uniform_int_distribution<size_t>(lo, hi)(rng);
  };
  auto random_factorization = [&](size_t n) {
    std::vector<std::pair<std::string, size_t>> dims;
    size_t i = 0;
    while (n > 1) {
      std::vector<size_t> divisors;
      for (size_t d = 2; d <= n; ++d) {
        if (n % d == 0) divisors.push_back(d);
      }
      size_t d = divisors[uniform(0, divisors.size() - 1)];
      dims.emplace_back(indexed_name("r", i++), d);
      n /= d;
      if (uniform(0, 4) == 0) dims.emplace_back(indexed_name("r", i++), 1);
    }
    if (dims.empty()) dims.emplace_back("r0", 1);
    return dims;
  };
  for (int trial = 0; trial < 60; ++trial) {
    Shape base = make_shape({{"a", uniform(1, 4)}, {"b", uniform(1, 6)}, {"c", uniform(1, 4)}});
    ASSERT_TRUE(base.slice().is_contiguous());
    auto dims = random_factorization(base.size());
    absl::StatusOr<Shape> reshaped = base.reshape(dims);
    ASSERT_TRUE(reshaped.ok()) << reshaped.status();
    ASSERT_EQ(reshaped->slice().ranks(), base.slice().ranks());

    size_t b = *base.size_of("b");
    Shape view = *base.select("b", Range(0, static_cast<int64_t>(b), static_cast<int64_t>(uniform(1, 2))));
    absl::StatusOr<Shape> r = view.reshape(random_factorization(view.size()));
    if (r.ok()) {
      ASSERT_EQ(r->slice().ranks(), view.slice().ranks()) << view.to_string();
    } else {
      ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, ShapeProperty, ::testing::Values(1u, 2u, 3u, 42u, 2026u));

}  // namespace
}  // namespace castmesh
