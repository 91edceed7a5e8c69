// A program that includes only castmesh/castmesh.h and is built with only the
// public include folders (castmesh::core's interface, not src/): each area a
// user reaches through the umbrella header is used once, so a header left out
// of castmesh.h, or one that needs a private header, fails this build.
#include "castmesh/castmesh.h"

#include <cstdint>
#include <filesystem>
#include <string>
#include <type_traits>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

namespace {

struct AddRank {};

// A mesh member that sums its rank over the mesh with the communicator.
class Summer : public castmesh::Actor {
 public:
  absl::StatusOr<int64_t> sum(const AddRank&) {
    absl::StatusOr<castmesh::Communicator> comm = castmesh::Communicator::current();
    if (!comm.ok()) return comm.status();
    int64_t value = comm->rank() + 1;
    castmesh::TensorView view = castmesh::TensorView::Contiguous(&value, castmesh::DType::kInt64, {1});
    if (absl::Status st = comm->allreduce(view, view, castmesh::ReduceOp::kSum); !st.ok()) return st;
    return value;
  }
  using Handlers = castmesh::Handlers<&Summer::sum>;
};

TEST(CastmeshHeader, ActorMeshCommunicatorAndTensors) {
  castmesh::Runtime runtime(castmesh::RuntimeOptions{.workers = 4});
  auto mesh = castmesh::ActorMesh<Summer>::Spawn(runtime, *castmesh::Shape::Create({{"ranks", size_t{3}}}),
                                                 castmesh::MeshOptions{.name = "summer"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  absl::StatusOr<castmesh::ValueMesh<int64_t>> sums = mesh->call(AddRank{}).get(absl::Seconds(60));
  ASSERT_TRUE(sums.ok()) << sums.status();
  for (int64_t sum : sums->values()) EXPECT_EQ(sum, 1 + 2 + 3);
  mesh->stop();
}

TEST(CastmeshHeader, RdmaBufferInOneProc) {
  castmesh::Runtime runtime;
  castmesh::TensorView memory = castmesh::TensorView::Allocate(castmesh::DType::kUInt8, {64});
  for (int i = 0; i < 64; ++i) static_cast<uint8_t*>(memory.data())[i] = static_cast<uint8_t>(i);
  auto buffer = castmesh::RdmaBuffer::register_memory(memory, castmesh::RdmaAccess::kRead, &runtime);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  castmesh::TensorView dst = castmesh::TensorView::Allocate(castmesh::DType::kUInt8, {8});
  auto read = buffer->read_into(dst, castmesh::RdmaOptions{.offset = 10}).get(absl::Seconds(10));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(static_cast<uint8_t*>(dst.data())[0], 10);
}

TEST(CastmeshHeader, ProcAndHostMeshesRejectBadInput) {
  castmesh::Runtime runtime;
  // No agent to attach to: a clear error, not a crash.
  auto hosts = castmesh::HostMesh::attach(runtime, {"not an address"});
  EXPECT_FALSE(hosts.ok());
  static_assert(std::is_class_v<castmesh::ProcMesh>);
  EXPECT_TRUE(castmesh::flush_forwarded_output(runtime).ok());
}

TEST(CastmeshHeader, ConfigTraceBackendsAndVersion) {
  EXPECT_FALSE(castmesh::config::settings().empty());
  EXPECT_EQ(castmesh::config::value_text(castmesh::config::global(), "no such setting").status().code(),
            absl::StatusCode::kInvalidArgument);

  std::string path = (std::filesystem::temp_directory_path() /
                      ("castmesh_h_test_" + std::to_string(::getpid()) + ".json")).string();
  ASSERT_TRUE(castmesh::trace::start(path).ok());
  EXPECT_TRUE(castmesh::trace::recording());
  { castmesh::trace::Span span("castmesh_h_test"); }
  auto summary = castmesh::trace::stop();
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_GE(summary->records, 1u);
  std::filesystem::remove(path);

  // Without the tensor_engine backend device memory says how to install it.
  auto devices = castmesh::device_list();
  if (!devices.ok()) {
    EXPECT_EQ(devices.status().code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_FALSE(castmesh::DeviceStream().valid());
  (void)castmesh::backends();
  EXPECT_EQ(std::string(castmesh::version()), CASTMESH_VERSION_STRING);
}

}  // namespace
