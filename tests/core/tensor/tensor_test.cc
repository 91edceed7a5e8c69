// TensorView construction, validation, contiguity, copies, devices, dtypes.
#include "castmesh/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

namespace castmesh {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(TensorViewTest, DefaultIsEmpty) {
  TensorView view;
  EXPECT_EQ(view.data(), nullptr);
  EXPECT_EQ(view.numel(), 0);
  EXPECT_EQ(view.nbytes(), 0u);
  EXPECT_EQ(view.ndim(), 1);
  EXPECT_TRUE(view.is_contiguous());
  EXPECT_TRUE(view.device().is_cpu());
  EXPECT_EQ(view.owner(), nullptr);
}

TEST(TensorViewTest, CreateFillsContiguousStrides) {
  std::vector<float> data(24);
  absl::StatusOr<TensorView> view = TensorView::Create(data.data(), DType::kFloat32, {2, 3, 4}, {});
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->strides(), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(view->numel(), 24);
  EXPECT_EQ(view->nbytes(), 96u);
  EXPECT_EQ(view->itemsize(), 4u);
  EXPECT_EQ(view->ndim(), 3);
  EXPECT_TRUE(view->is_contiguous());
  EXPECT_EQ(view->data(), data.data());
  EXPECT_EQ(view->to_string(), "TensorView(float32[2, 3, 4], strides=[12, 4, 1], cpu)");
}

// Up to kInlineDims dimensions live inside the view, more on the heap: both
// must describe the same memory after copies, moves and a contiguous copy.
TEST(TensorViewTest, ManyDimensionsSurviveCopiesPastTheInlineStorage) {
  for (size_t ndim : {TensorView::kInlineDims, TensorView::kInlineDims + 2}) {
    std::vector<int64_t> shape(ndim, 2);
    std::vector<int64_t> strides(ndim);
    int64_t step = 1;
    for (size_t i = ndim; i-- > 0;) {
      strides[i] = step;
      step *= 2;
    }
    std::vector<int32_t> data(static_cast<size_t>(step));
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<int32_t>(i);
    absl::StatusOr<TensorView> made = TensorView::Create(data.data(), DType::kInt32, shape, strides);
    ASSERT_TRUE(made.ok()) << made.status();
    TensorView copy = *made;
    TensorView moved = std::move(*made);
    for (const TensorView* v : {&copy, &moved}) {
      EXPECT_EQ(v->shape(), shape) << ndim;
      EXPECT_EQ(v->strides(), strides) << ndim;
      EXPECT_EQ(v->numel(), step);
    }
    // The spans point into each view's own storage, not a shared one.
    EXPECT_NE(copy.shape().data(), moved.shape().data());
    absl::StatusOr<TensorView> dense = copy.ContiguousCopy();
    ASSERT_TRUE(dense.ok()) << dense.status();
    EXPECT_EQ(dense->shape(), shape);
    EXPECT_EQ(std::memcmp(dense->data(), data.data(), data.size() * sizeof(int32_t)), 0) << ndim;
  }
}

TEST(TensorViewTest, ZeroDimensionalHasOneElement) {
  double value = 1.5;
  TensorView view = TensorView::Contiguous(&value, DType::kFloat64, {});
  EXPECT_EQ(view.ndim(), 0);
  EXPECT_EQ(view.numel(), 1);
  EXPECT_EQ(view.nbytes(), 8u);
  EXPECT_TRUE(view.strides().empty());
  EXPECT_TRUE(view.is_contiguous());
}

TEST(TensorViewTest, ByteOffsetMovesDataPointer) {
  std::vector<int32_t> data(10);
  absl::StatusOr<TensorView> view =
      TensorView::Create(data.data(), DType::kInt32, {4}, {2}, Device{}, nullptr, true, 8);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->data(), &data[2]);
  EXPECT_EQ(view->byte_offset(), 8);
  EXPECT_TRUE(view->read_only());
  EXPECT_FALSE(view->is_contiguous());
  EXPECT_EQ(view->to_string(), "TensorView(int32[4], strides=[2], cpu, read-only)");
}

TEST(TensorViewTest, WithOwnerReplacesOnlyTheOwner) {
  std::vector<int8_t> data(8);
  auto first = std::make_shared<int>(1);
  auto second = std::make_shared<int>(2);
  absl::StatusOr<TensorView> view =
      TensorView::Create(data.data(), DType::kInt8, {4}, {2}, Device{}, first, true, 1);
  ASSERT_TRUE(view.ok());
  TensorView other = view->with_owner(second);
  EXPECT_EQ(other.owner(), second);
  EXPECT_EQ(view->owner(), first);
  EXPECT_EQ(other.data(), view->data());
  EXPECT_EQ(other.byte_offset(), 1);
  EXPECT_EQ(other.strides(), view->strides());
  EXPECT_TRUE(other.read_only());
}

TEST(TensorViewTest, ContiguityIgnoresUnitDimensionsAndEmptyViews) {
  std::vector<float> data(6);
  EXPECT_TRUE(TensorView::Create(data.data(), DType::kFloat32, {2, 1, 3}, {3, 99, 1})->is_contiguous());
  EXPECT_FALSE(TensorView::Create(data.data(), DType::kFloat32, {2, 3}, {1, 2})->is_contiguous());  // transposed
  EXPECT_FALSE(TensorView::Create(data.data(), DType::kFloat32, {3}, {0})->is_contiguous());        // broadcast
  EXPECT_TRUE(TensorView::Create(nullptr, DType::kFloat32, {0, 5}, {7, 3})->is_contiguous());
}

TEST(TensorViewTest, CreateRejectsBadShapes) {
  float x = 0;
  auto expect_invalid = [](const absl::StatusOr<TensorView>& view, std::string_view needle) {
    ASSERT_FALSE(view.ok());
    EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(view.status().message()).find(needle), std::string::npos) << view.status();
  };
  expect_invalid(TensorView::Create(&x, DType::kFloat32, {2, -3}, {}), "shape[1] is -3");
  expect_invalid(TensorView::Create(&x, DType::kFloat32, {2, 3}, {1}), "strides has 1 entries but shape has 2");
  expect_invalid(TensorView::Create(&x, DType::kFloat32, {1}, {}, Device{}, nullptr, false, -4), "negative");
  expect_invalid(TensorView::Create(nullptr, DType::kFloat32, {3}, {}), "null data pointer for 3 elements");
  expect_invalid(TensorView::Create(&x, DType::kFloat32, {int64_t{1} << 32, int64_t{1} << 32}, {}),
                 "more than 2^63 elements");
  expect_invalid(TensorView::Create(&x, DType::kFloat64, {int64_t{1} << 61}, {}), "more than 2^63 bytes");
  expect_invalid(TensorView::Create(&x, DType::kInt8, {3}, {kMax / 2 + 1}), "overflow 64-bit offsets");
  expect_invalid(TensorView::Create(&x, DType::kInt8, {3, 2}, {kMax / 2, kMax / 2}), "overflow 64-bit offsets");
  expect_invalid(TensorView::Create(&x, DType::kInt64, {2}, {kMax / 8 + 1}), "overflow 64-bit byte offsets");
  expect_invalid(TensorView::Create(&x, DType::kInt8, {2}, {1}, Device{}, nullptr, false, kMax), "byte offset");
}

TEST(TensorViewTest, NegativeAndZeroStridesAreLegal) {
  int8_t x[4] = {};
  EXPECT_TRUE(TensorView::Create(&x[0], DType::kInt8, {2}, {-1}, Device{}, nullptr, false, 1).ok());
  EXPECT_TRUE(TensorView::Create(&x[0], DType::kInt8, {5, 2}, {0, 1}).ok());
}

TEST(TensorViewTest, EmptyTensorsMayHaveNullData) {
  absl::StatusOr<TensorView> view = TensorView::Create(nullptr, DType::kUInt16, {3, 0}, {});
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->numel(), 0);
  EXPECT_EQ(view->data(), nullptr);
}

TEST(TensorViewTest, AllocateIsZeroedAlignedAndOwned) {
  TensorView view = TensorView::Allocate(DType::kInt16, {3, 5});
  ASSERT_NE(view.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(view.data()) % 64, 0u);
  EXPECT_NE(view.owner(), nullptr);
  EXPECT_FALSE(view.read_only());
  const auto* values = static_cast<const int16_t*>(view.data());
  for (int i = 0; i < 15; ++i) EXPECT_EQ(values[i], 0);
  TensorView empty = TensorView::Allocate(DType::kFloat32, {0});
  EXPECT_NE(empty.data(), nullptr);  // even an empty allocation is a real pointer
}

TEST(TensorViewTest, TryAllocateReportsBadShapesAndExhaustion) {
  EXPECT_EQ(TensorView::TryAllocate(DType::kInt8, {-1}).status().code(), absl::StatusCode::kInvalidArgument);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // Sanitizer allocators abort on such a request instead of returning null.
  EXPECT_EQ(TensorView::TryAllocate(DType::kInt8, {kMax - 10}).status().code(),
            absl::StatusCode::kResourceExhausted);
#endif
}

TEST(TensorViewDeathTest, ContiguousAndAllocateAbortWithTheReason) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(TensorView::Contiguous(nullptr, DType::kFloat32, {4}), "TensorView::Contiguous: null data pointer");
  EXPECT_DEATH(TensorView::Allocate(DType::kFloat32, {-2}), "TensorView::Allocate: shape\\[0\\] is -2");
}

TEST(TensorViewTest, ContiguousCopyOfTransposedAndReversedViews) {
  std::vector<int32_t> data(6);
  std::iota(data.begin(), data.end(), 0);  // [[0 1 2] [3 4 5]]
  absl::StatusOr<TensorView> transposed = TensorView::Create(data.data(), DType::kInt32, {3, 2}, {1, 3});
  ASSERT_TRUE(transposed.ok());
  absl::StatusOr<TensorView> copy = transposed->ContiguousCopy();
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_TRUE(copy->is_contiguous());
  EXPECT_EQ(copy->shape(), (std::vector<int64_t>{3, 2}));
  const auto* out = static_cast<const int32_t*>(copy->data());
  EXPECT_EQ(std::vector<int32_t>(out, out + 6), (std::vector<int32_t>{0, 3, 1, 4, 2, 5}));

  // Reversed rows: base at the last element, negative stride.
  absl::StatusOr<TensorView> reversed =
      TensorView::Create(data.data(), DType::kInt32, {2, 3}, {-3, 1}, Device{}, nullptr, true, 3 * 4);
  ASSERT_TRUE(reversed.ok()) << reversed.status();
  copy = reversed->ContiguousCopy();
  ASSERT_TRUE(copy.ok());
  EXPECT_FALSE(copy->read_only());
  out = static_cast<const int32_t*>(copy->data());
  EXPECT_EQ(std::vector<int32_t>(out, out + 6), (std::vector<int32_t>{3, 4, 5, 0, 1, 2}));
}

TEST(TensorViewTest, ContiguousCopyRefusesDeviceMemory) {
  int x = 0;
  absl::StatusOr<TensorView> gpu = TensorView::Create(&x, DType::kInt32, {1}, {}, Device{DeviceKind::kCuda, 1});
  ASSERT_TRUE(gpu.ok());
  EXPECT_EQ(gpu->ContiguousCopy().status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<TensorView> pinned = TensorView::Create(&x, DType::kInt32, {1}, {}, Device{DeviceKind::kCudaHost, 0});
  EXPECT_TRUE(pinned->ContiguousCopy().ok());
}

TEST(DeviceTest, NamesAndHostAccess) {
  EXPECT_EQ(Device{}.to_string(), "cpu");
  EXPECT_EQ((Device{DeviceKind::kCuda, 3}.to_string()), "cuda:3");
  EXPECT_EQ((Device{DeviceKind::kRocmHost, 0}.to_string()), "rocm_host:0");
  EXPECT_TRUE((Device{DeviceKind::kCudaManaged, 0}.is_host_accessible()));
  EXPECT_FALSE((Device{DeviceKind::kRocm, 0}.is_host_accessible()));
  EXPECT_FALSE((Device{DeviceKind::kCudaHost, 0}.is_cpu()));
  EXPECT_EQ(device_kind_from_dlpack(13), DeviceKind::kCudaManaged);
  EXPECT_EQ(device_kind_from_dlpack(5), std::nullopt);  // retired code
  EXPECT_EQ(device_kind_from_dlpack(0), std::nullopt);
}

TEST(DTypeDLPackTest, EveryDTypeRoundTripsAndMatchesTheSpecification) {
  for (DType dtype : kAllDTypes) {
    DLDataType dl = dtype_to_dlpack(dtype);
    EXPECT_EQ(dl.lanes, 1);
    EXPECT_EQ(dtype_from_dlpack(dl), dtype) << dtype_name(dtype);
  }
  auto same = [](DLDataType a, DLDataType b) { return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes; };
  EXPECT_TRUE(same(dtype_to_dlpack(DType::kInt8), DLDataType{0, 8, 1}));
  EXPECT_TRUE(same(dtype_to_dlpack(DType::kUInt64), DLDataType{1, 64, 1}));
  EXPECT_TRUE(same(dtype_to_dlpack(DType::kFloat16), DLDataType{2, 16, 1}));
  EXPECT_TRUE(same(dtype_to_dlpack(DType::kBFloat16), DLDataType{4, 16, 1}));
  EXPECT_TRUE(same(dtype_to_dlpack(DType::kBool), DLDataType{6, 8, 1}));
  EXPECT_EQ(dtype_from_dlpack(DLDataType{kDLFloat, 32, 4}), std::nullopt);
  EXPECT_EQ(dtype_from_dlpack(DLDataType{kDLComplex, 64, 1}), std::nullopt);
  EXPECT_EQ(dtype_from_dlpack(DLDataType{kDLFloat, 8, 1}), std::nullopt);
  EXPECT_EQ(dtype_from_dlpack(DLDataType{kDLBool, 1, 1}), std::nullopt);
}

}  // namespace
}  // namespace castmesh
