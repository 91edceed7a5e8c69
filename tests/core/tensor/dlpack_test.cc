// DLPack export/import of TensorView: fields, ownership (deleters exactly
// once), round trips, malformed producer tensors.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <ostream>
#include <vector>

#include "castmesh/dlpack.h"
#include "castmesh/tensor.h"

namespace castmesh {
namespace {

// A producer-side tensor as another library would hand it over: its own
// shape/strides storage and a deleter that counts its calls.
template <typename Managed>
struct FakeProducer {
  std::vector<float> data = std::vector<float>(12, 1.0f);
  std::vector<int64_t> shape{3, 4};
  std::vector<int64_t> strides{4, 1};
  Managed managed{};
  int deletes = 0;

  FakeProducer() {
    managed.manager_ctx = this;
    managed.deleter = [](Managed* self) { ++static_cast<FakeProducer*>(self->manager_ctx)->deletes; };
    DLTensor& t = managed.dl_tensor;
    t.data = data.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 2;
    t.dtype = DLDataType{kDLFloat, 32, 1};
    t.shape = shape.data();
    t.strides = strides.data();
    t.byte_offset = 0;
    if constexpr (std::is_same_v<Managed, DLManagedTensorVersioned>) managed.version = DLPackVersion{1, 0};
  }
};

using Versioned = FakeProducer<DLManagedTensorVersioned>;
using Legacy = FakeProducer<DLManagedTensor>;

// An owner whose destruction is observable.
std::shared_ptr<void> counting_owner(int* destroyed) {
  return std::shared_ptr<void>(new int(0), [destroyed](void* p) {
    delete static_cast<int*>(p);
    ++*destroyed;
  });
}

TEST(DLPackExportTest, VersionedDescribesTheView) {
  std::vector<int16_t> data(20);
  absl::StatusOr<TensorView> view = TensorView::Create(data.data(), DType::kInt16, {2, 5}, {10, 2},
                                                       Device{DeviceKind::kCudaHost, 1}, nullptr, true, 4);
  ASSERT_TRUE(view.ok()) << view.status();
  DLManagedTensorVersioned* managed = view->to_dlpack_versioned();
  EXPECT_EQ(managed->version.major, 1u);
  EXPECT_EQ(managed->version.minor, 0u);
  EXPECT_EQ(managed->flags, kDLPackFlagBitmaskReadOnly);
  const DLTensor& t = managed->dl_tensor;
  EXPECT_EQ(t.data, data.data());  // base pointer; byte_offset carried separately
  EXPECT_EQ(t.byte_offset, 4u);
  EXPECT_EQ(t.device.device_type, kDLCUDAHost);
  EXPECT_EQ(t.device.device_id, 1);
  EXPECT_EQ(t.ndim, 2);
  EXPECT_EQ(t.dtype.code, kDLInt);
  EXPECT_EQ(t.dtype.bits, 16);
  EXPECT_EQ(t.dtype.lanes, 1);
  EXPECT_EQ(std::vector<int64_t>(t.shape, t.shape + 2), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(std::vector<int64_t>(t.strides, t.strides + 2), (std::vector<int64_t>{10, 2}));
  managed->deleter(managed);
}

TEST(DLPackExportTest, WritableViewHasNoFlags) {
  TensorView view = TensorView::Allocate(DType::kFloat32, {3});
  DLManagedTensorVersioned* managed = view.to_dlpack_versioned();
  EXPECT_EQ(managed->flags, 0u);
  managed->deleter(managed);
}

TEST(DLPackExportTest, ExportKeepsOwnerAliveUntilDeleter) {
  int destroyed = 0;
  std::vector<uint8_t> data(8);
  DLManagedTensorVersioned* versioned = nullptr;
  DLManagedTensor* legacy = nullptr;
  {
    TensorView view = TensorView::Contiguous(data.data(), DType::kUInt8, {8}, counting_owner(&destroyed));
    versioned = view.to_dlpack_versioned();
    legacy = view.to_dlpack_legacy();
  }
  EXPECT_EQ(destroyed, 0);  // the view died; both exports still hold the owner
  versioned->deleter(versioned);
  EXPECT_EQ(destroyed, 0);
  EXPECT_EQ(legacy->dl_tensor.shape[0], 8);  // the export's arrays outlive the view
  legacy->deleter(legacy);
  EXPECT_EQ(destroyed, 1);
}

TEST(DLPackImportTest, DeleterRunsExactlyOnceAfterLastCopy) {
  Versioned producer;
  absl::StatusOr<TensorView> view = TensorView::FromDLPack(&producer.managed);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->data(), producer.data.data());
  EXPECT_EQ(view->shape(), producer.shape);
  EXPECT_EQ(view->dtype(), DType::kFloat32);
  EXPECT_FALSE(view->read_only());
  TensorView copy = *view;
  view = absl::UnknownError("drop the first copy");
  EXPECT_EQ(producer.deletes, 0);
  { TensorView another = copy; }
  EXPECT_EQ(producer.deletes, 0);
  copy = TensorView();
  EXPECT_EQ(producer.deletes, 1);
}

TEST(DLPackImportTest, LegacyDeleterRunsExactlyOnce) {
  Legacy producer;
  {
    absl::StatusOr<TensorView> view = TensorView::FromDLPack(&producer.managed);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->numel(), 12);
    EXPECT_EQ(producer.deletes, 0);
  }
  EXPECT_EQ(producer.deletes, 1);
}

TEST(DLPackImportTest, ReadOnlyFlagAndNullStridesAndByteOffset) {
  Versioned producer;
  producer.managed.flags = kDLPackFlagBitmaskReadOnly | kDLPackFlagBitmaskIsCopied;
  producer.managed.dl_tensor.strides = nullptr;
  producer.managed.dl_tensor.byte_offset = 8;
  producer.shape = {2, 5};
  producer.managed.dl_tensor.shape = producer.shape.data();
  absl::StatusOr<TensorView> view = TensorView::FromDLPack(&producer.managed);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(view->read_only());
  EXPECT_EQ(view->strides(), (std::vector<int64_t>{5, 1}));
  EXPECT_EQ(view->data(), &producer.data[2]);
}

TEST(DLPackImportTest, NullDeleterIsAllowed) {
  Versioned producer;
  producer.managed.deleter = nullptr;
  EXPECT_TRUE(TensorView::FromDLPack(&producer.managed).ok());
}

TEST(DLPackImportTest, NullManagedTensorsAreErrors) {
  EXPECT_EQ(TensorView::FromDLPack(static_cast<DLManagedTensorVersioned*>(nullptr)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TensorView::FromDLPack(static_cast<DLManagedTensor*>(nullptr)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// One malformed field of a producer's tensor, the code and message expected,
// and (always) exactly one deleter call.
struct Malformed {
  const char* name;
  void (*spoil)(Versioned&);
  absl::StatusCode code;
  const char* message;
};

// Names the case in test listings (instead of the struct's bytes).
void PrintTo(const Malformed& malformed, std::ostream* out) { *out << malformed.name; }

class DLPackMalformedTest : public ::testing::TestWithParam<Malformed> {};

TEST_P(DLPackMalformedTest, IsRejectedAndReleased) {
  Versioned producer;
  GetParam().spoil(producer);
  absl::StatusOr<TensorView> view = TensorView::FromDLPack(&producer.managed);
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().code(), GetParam().code) << view.status();
  EXPECT_NE(std::string(view.status().message()).find(GetParam().message), std::string::npos) << view.status();
  EXPECT_EQ(producer.deletes, 1);
}

INSTANTIATE_TEST_SUITE_P(
    Fields, DLPackMalformedTest,
    ::testing::Values(
        Malformed{"MajorVersion", [](Versioned& p) { p.managed.version = {2, 0}; },
                  absl::StatusCode::kInvalidArgument, "DLPack version 2.0 is not supported"},
        Malformed{"NegativeNdim", [](Versioned& p) { p.managed.dl_tensor.ndim = -1; },
                  absl::StatusCode::kInvalidArgument, "ndim -1"},
        Malformed{"NullShape", [](Versioned& p) { p.managed.dl_tensor.shape = nullptr; },
                  absl::StatusCode::kInvalidArgument, "null shape"},
        Malformed{"NegativeSize", [](Versioned& p) { p.shape[1] = -4; }, absl::StatusCode::kInvalidArgument,
                  "shape[1] is -4"},
        Malformed{"NullData", [](Versioned& p) { p.managed.dl_tensor.data = nullptr; },
                  absl::StatusCode::kInvalidArgument, "null data pointer for 12 elements"},
        Malformed{"Lanes", [](Versioned& p) { p.managed.dl_tensor.dtype.lanes = 4; },
                  absl::StatusCode::kUnimplemented, "single-lane"},
        Malformed{"Complex", [](Versioned& p) { p.managed.dl_tensor.dtype = {kDLComplex, 64, 1}; },
                  absl::StatusCode::kUnimplemented, "(code=5, bits=64, lanes=1) is not supported"},
        Malformed{"OddBits", [](Versioned& p) { p.managed.dl_tensor.dtype.bits = 24; },
                  absl::StatusCode::kUnimplemented, "bits=24"},
        Malformed{"UnknownCode", [](Versioned& p) { p.managed.dl_tensor.dtype.code = 99; },
                  absl::StatusCode::kUnimplemented, "code=99"},
        Malformed{"Device", [](Versioned& p) { p.managed.dl_tensor.device.device_type = DLDeviceType(99); },
                  absl::StatusCode::kUnimplemented, "device type 99"},
        Malformed{"HugeByteOffset", [](Versioned& p) { p.managed.dl_tensor.byte_offset = uint64_t{1} << 63; },
                  absl::StatusCode::kInvalidArgument, "byte_offset"},
        Malformed{"OverflowingStrides",
                  [](Versioned& p) { p.strides[0] = std::numeric_limits<int64_t>::max() / 2; },
                  absl::StatusCode::kInvalidArgument, "overflow"},
        Malformed{"ElementCountOverflow", [](Versioned& p) { p.shape = {int64_t{1} << 62, 8}; },
                  absl::StatusCode::kInvalidArgument, "2^63"}),
    [](const ::testing::TestParamInfo<Malformed>& info) { return info.param.name; });

TEST(DLPackImportTest, LegacyMalformedIsReleasedToo) {
  Legacy producer;
  producer.managed.dl_tensor.dtype = DLDataType{kDLFloat, 32, 2};
  EXPECT_EQ(TensorView::FromDLPack(&producer.managed).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(producer.deletes, 1);
}

TEST(DLPackImportTest, EmptyTensorWithNullDataIsFine) {
  Versioned producer;
  producer.shape = {0, 4};
  producer.managed.dl_tensor.data = nullptr;
  absl::StatusOr<TensorView> view = TensorView::FromDLPack(&producer.managed);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->numel(), 0);
}

TEST(DLPackRoundTripTest, VersionedPreservesEverythingAndSharesMemory) {
  int destroyed = 0;
  std::vector<double> data(30);
  std::iota(data.begin(), data.end(), 0.0);
  absl::StatusOr<TensorView> original = TensorView::Create(data.data(), DType::kFloat64, {3, 4}, {-10, 2},
                                                           Device{}, counting_owner(&destroyed), true, 20 * 8);
  ASSERT_TRUE(original.ok()) << original.status();
  absl::StatusOr<TensorView> back = TensorView::FromDLPack(original->to_dlpack_versioned());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data(), original->data());
  EXPECT_EQ(back->shape(), original->shape());
  EXPECT_EQ(back->strides(), original->strides());
  EXPECT_EQ(back->byte_offset(), original->byte_offset());
  EXPECT_EQ(back->dtype(), DType::kFloat64);
  EXPECT_TRUE(back->read_only());
  EXPECT_EQ(static_cast<const double*>(back->data())[0], 20.0);
  original = absl::UnknownError("gone");
  EXPECT_EQ(destroyed, 0);  // the imported view holds the export, which holds the owner
  back = absl::UnknownError("gone");
  EXPECT_EQ(destroyed, 1);
}

TEST(DLPackRoundTripTest, LegacyForEveryDTypeAndDevice) {
  for (DType dtype : kAllDTypes) {
    TensorView original = TensorView::Allocate(dtype, {2, 3});
    absl::StatusOr<TensorView> back = TensorView::FromDLPack(original.to_dlpack_legacy());
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->dtype(), dtype);
    EXPECT_EQ(back->data(), original.data());
    EXPECT_EQ(back->nbytes(), original.nbytes());
    EXPECT_FALSE(back->read_only());  // legacy tensors cannot say read-only
  }
  int x = 0;
  absl::StatusOr<TensorView> gpu = TensorView::Create(&x, DType::kInt32, {1}, {}, Device{DeviceKind::kRocm, 2});
  absl::StatusOr<TensorView> back = TensorView::FromDLPack(gpu->to_dlpack_legacy());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->device(), (Device{DeviceKind::kRocm, 2}));
}

TEST(DLPackRoundTripTest, ZeroDimensional) {
  float x = 3.0f;
  absl::StatusOr<TensorView> back =
      TensorView::FromDLPack(TensorView::Contiguous(&x, DType::kFloat32, {}).to_dlpack_versioned());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ndim(), 0);
  EXPECT_EQ(back->numel(), 1);
  EXPECT_EQ(back->data(), &x);
}

}  // namespace
}  // namespace castmesh
