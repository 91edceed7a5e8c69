// The native-stream entries of the tensor_engine table (stream_wrap,
// stream_native) behind the DLPack stream protocol, over the FAKE CUDA
// plugin: a wrapped stream is the same stream, destroying the wrap leaves the
// native stream alone, order_after_castmesh_work holds a consumer's stream
// behind castmesh's pending work, and a plugin whose table ends at group_end
// (an earlier 1.1 build) is still accepted, without native streams.
#include <condition_variable>
#include <cstddef>
#include <mutex>

#include "castmesh/backend.h"
#include "castmesh/tensor_engine.h"
#include "core/collectives/fake_tensor_engine.h"
#include "core/tensor/device_engine.h"

namespace castmesh {
namespace {

using testing::fake_engine;
using testing::Gate;
using testing::gpu;
using testing::on_device;

TEST(FakeDLPackStreams, AWrappedStreamIsTheSameStreamAndIsNotDestroyedWithTheWrap) {
  fake_engine();
  auto own = DeviceStream::Create(gpu(1));
  ASSERT_TRUE(own.ok()) << own.status();
  auto native = own->native_handle();
  ASSERT_TRUE(native.ok()) << native.status();
  EXPECT_NE(*native, 0u);
  auto t = on_device<int32_t>({5, 6}, DType::kInt32, gpu(1));
  ASSERT_TRUE(t.ok()) << t.status();
  Gate gate;
  fake_engine().launch(own->handle(), &Gate::wait, &gate);
  int32_t host[2] = {0, 0};
  {
    auto wrapped = DeviceStream::FromNative(gpu(1), *native);
    ASSERT_TRUE(wrapped.ok()) << wrapped.status();
    EXPECT_EQ(*wrapped->native_handle(), *native);
    ASSERT_TRUE(device_copy(TensorView::Contiguous(host, DType::kInt32, {2}), *t, *wrapped).ok());
    EXPECT_FALSE(*wrapped->query());  // behind the held kernel of `own`: one stream
  }  // the wrap is gone; the stream (and the queued copy) are not
  EXPECT_FALSE(*own->query());
  gate.release();
  ASSERT_TRUE(own->synchronize().ok());
  EXPECT_EQ(host[1], 6);
  // Bad input: another kind of device, an index the backend did not report.
  EXPECT_EQ(DeviceStream::FromNative(Device{DeviceKind::kRocm, 0}, *native).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceStream::FromNative(gpu(9), *native).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceStream().native_handle().status().code(), absl::StatusCode::kInvalidArgument);
}

// The producer side of the protocol: a consumer's stream waits for the work
// castmesh has queued on its own streams of that device (and only that device).
TEST(FakeDLPackStreams, TheConsumersStreamWaitsForCastmeshsPendingWork) {
  fake_engine();
  auto producer = DeviceStream::Create(gpu(2));
  auto consumer_own = DeviceStream::Create(gpu(2));
  auto elsewhere = DeviceStream::Create(gpu(3));
  ASSERT_TRUE(producer.ok() && consumer_own.ok() && elsewhere.ok());
  auto t = on_device<int32_t>({0, 0, 0}, DType::kInt32, gpu(2));
  ASSERT_TRUE(t.ok()) << t.status();
  Gate gate;
  Gate other_device;
  fake_engine().launch(producer->handle(), &Gate::wait, &gate);
  fake_engine().launch(elsewhere->handle(), &Gate::wait, &other_device);  // must not hold the consumer
  int32_t values[3] = {7, 8, 9};
  ASSERT_TRUE(device_copy(*t, TensorView::Contiguous(values, DType::kInt32, {3}), *producer).ok());
  // The consumer hands over its stream as a native handle (what DLPack passes).
  auto consumer = DeviceStream::FromNative(gpu(2), *consumer_own->native_handle());
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  ASSERT_TRUE(order_after_castmesh_work(*consumer).ok());
  int32_t seen[3] = {0, 0, 0};
  ASSERT_TRUE(device_copy(TensorView::Contiguous(seen, DType::kInt32, {3}), *t, *consumer).ok());
  EXPECT_FALSE(*consumer->query());  // held behind the producer's copy
  gate.release();
  ASSERT_TRUE(consumer->synchronize().ok());
  EXPECT_EQ(seen[0], 7);
  EXPECT_EQ(seen[2], 9);
  other_device.release();
  ASSERT_TRUE(elsewhere->synchronize().ok());
  EXPECT_EQ(order_after_castmesh_work(DeviceStream()).code(), absl::StatusCode::kInvalidArgument);
}

// A table of an earlier 1.1 build ends at group_end: the loader still
// accepts it, and the core sees no native streams (and says so).
TEST(FakeDLPackStreams, ATableEndingAtGroupEndStillLoadsWithoutNativeStreams) {
  fake_engine();
  absl::StatusOr<const Backend*> backend = load_backend("tensor_engine");
  ASSERT_TRUE(backend.ok()) << backend.status();
  const castmesh_tensor_engine_table_v1* full = tensor_engine_table(**backend);
  ASSERT_NE(full, nullptr);
  EXPECT_TRUE(detail::has_native_streams(*full));
  castmesh_tensor_engine_table_v1 older = *full;
  older.struct_size = offsetof(castmesh_tensor_engine_table_v1, group_end) + sizeof older.group_end;
  EXPECT_FALSE(detail::has_native_streams(older));
  castmesh_backend_v1 record = (*backend)->table();
  record.tensor_engine = &older;
  EXPECT_EQ(tensor_engine_table(record), &older);  // still a usable tensor_engine table
  castmesh_tensor_engine_table_v1 missing = *full;
  missing.stream_native = nullptr;
  EXPECT_FALSE(detail::has_native_streams(missing));
}

}  // namespace
}  // namespace castmesh
