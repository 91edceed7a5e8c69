// The vendor-neutral tensor_engine backend (te_backend.c: the record, the
// init / query_devices flow, the table bound to the engine) over a test
// vendor: its runtime is FakeCuda, its collective library FakeNccl, and its
// device probe answers what each test sets. The CUDA and HIP plugins run this
// same code with their real vendors (te_cuda_real.c / te_hip_real.cc).
#include "te_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fake_cuda.h"

namespace castmesh {
namespace {

using ::castmesh::fakes::FakeCuda;
using ::castmesh::fakes::FakeNccl;
using ::testing::HasSubstr;

constexpr int kNoDeviceCode = 100;        // cudaErrorNoDevice, as FakeCuda's codes are CUDA's
constexpr int kInsufficientDriver = 35;   // cudaErrorInsufficientDriver

// What the test vendor's device probe answers; set by each test before init.
struct Probe {
  int driver = 12040;
  int runtime = 13000;
  int count = 2;
  int count_code = 0;
  int describe_code = 0;
};
Probe g_probe;

void probe_versions(int* driver, int* runtime) {
  *driver = g_probe.driver;
  *runtime = g_probe.runtime;
}
int probe_device_count(int* count) {
  *count = g_probe.count_code == 0 ? g_probe.count : 0;
  return g_probe.count_code;
}
int32_t probe_driver_failure(int driver, int runtime, int code, castmesh_error_v1* error) {
  return te_fail(error, CASTMESH_STATUS_NO_DRIVER, "test vendor: driver %d too old for runtime %d (code %d)", driver,
                 runtime, code);
}
int probe_describe_device(int index, castmesh_device_info_v1* out) {
  if (g_probe.describe_code != 0) return g_probe.describe_code;
  std::snprintf(out->name, sizeof out->name, "Test GPU %d", index);
  out->memory_bytes = (uint64_t{1} << 30) * (index + 1);
  std::snprintf(out->detail, sizeof out->detail, "compute_capability=9.%d", index);
  return 0;
}

const char* const kTestLibraries[] = {"libcastmesh-test-collectives.so.1", nullptr};

const te_vendor kTestVendor = {
    .version = "0.0.0+testvendor",
    .device_kind = CASTMESH_DEVICE_KIND_HIP,
    .runtime = FakeCuda::ops(),
    .load_collectives = &FakeNccl::load,
    .collective_libraries = kTestLibraries,
    .collective_hint = "TestCCL: install it",
    .versions = probe_versions,
    .device_count = probe_device_count,
    .device_count_call = "testGetDeviceCount",
    .no_device_code = kNoDeviceCode,
    .driver_failure = probe_driver_failure,
    .describe_device = probe_describe_device,
    .describe_device_call = "testGetDeviceProperties",
};

std::vector<std::string> g_log_lines;
void capture_log(castmesh_log_level_v1, const char* backend, const char* message) {
  g_log_lines.push_back(std::string(backend) + ": " + message);
}

const castmesh_host_api_v1* host() {
  static castmesh_host_api_v1 api{};
  api.struct_size = sizeof api;
  api.abi_major = CASTMESH_BACKEND_ABI_MAJOR;
  api.abi_minor = CASTMESH_BACKEND_ABI_MINOR;
  api.core_version = "test";
  api.log = &capture_log;
  return &api;
}

// The process's one record, bound to the test vendor; the probe reset.
const castmesh_backend_v1* backend() {
  g_probe = Probe{};
  g_log_lines.clear();
  return te_backend_init(&kTestVendor, host());
}

TEST(TensorEngineBackend, TheRecordCarriesTheVendorsVersionAndAWholeTensorEngineTable) {
  const castmesh_backend_v1* record = backend();
  ASSERT_NE(record, nullptr);
  EXPECT_EQ(record->struct_size, sizeof(castmesh_backend_v1));
  EXPECT_EQ(record->abi_major, uint32_t{CASTMESH_BACKEND_ABI_MAJOR});
  EXPECT_EQ(record->abi_minor, uint32_t{CASTMESH_BACKEND_ABI_MINOR});
  EXPECT_STREQ(record->name, "tensor_engine");
  EXPECT_STREQ(record->version, "0.0.0+testvendor");
  EXPECT_EQ(record->rdma, nullptr);
  const castmesh_tensor_engine_table_v1* te = record->tensor_engine;
  ASSERT_NE(te, nullptr);
  EXPECT_EQ(te->struct_size, sizeof(castmesh_tensor_engine_table_v1));
  // Every entry after struct_size is a function pointer, none NULL.
  const auto* first = reinterpret_cast<const unsigned char*>(te) + sizeof te->struct_size;
  const size_t entries = (sizeof *te - sizeof te->struct_size) / sizeof(void (*)());
  for (size_t k = 0; k < entries; ++k) {
    void (*entry)() = nullptr;
    std::memcpy(&entry, first + k * sizeof entry, sizeof entry);
    EXPECT_NE(entry, nullptr) << "entry " << k;
  }
}

TEST(TensorEngineBackend, ASecondInitKeepsTheRecordAndOtherVendorsOrAbisGetNone) {
  const castmesh_backend_v1* record = backend();
  EXPECT_EQ(te_backend_init(&kTestVendor, host()), record);
  te_vendor other = kTestVendor;
  EXPECT_EQ(te_backend_init(&other, host()), nullptr);
  castmesh_host_api_v1 newer = *host();
  newer.abi_major = CASTMESH_BACKEND_ABI_MAJOR + 1;
  EXPECT_EQ(te_backend_init(&kTestVendor, &newer), nullptr);
  EXPECT_EQ(te_backend_init(&kTestVendor, nullptr), nullptr);
}

TEST(TensorEngineBackend, InitCountsTheDevicesAndQueryDescribesEachOfTheVendorsKind) {
  const castmesh_backend_v1* record = backend();
  castmesh_error_v1 error{};
  ASSERT_EQ(record->init(&error), CASTMESH_STATUS_OK) << error.message;
  EXPECT_THAT(g_log_lines, ::testing::ElementsAre("tensor_engine: 2 FakeCUDA device(s), driver 12040, runtime 13000"));

  castmesh_device_info_v1 devices[3]{};
  for (castmesh_device_info_v1& device : devices) device.struct_size = sizeof device;
  uint32_t count = 0;
  ASSERT_EQ(record->query_devices(devices, 3, &count, &error), CASTMESH_STATUS_OK) << error.message;
  EXPECT_EQ(count, 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(devices[k].kind, CASTMESH_DEVICE_KIND_HIP);
    EXPECT_EQ(devices[k].index, k);
    EXPECT_EQ(std::string(devices[k].name), "Test GPU " + std::to_string(k));
    EXPECT_EQ(devices[k].memory_bytes, (uint64_t{1} << 30) * (k + 1));
  }
  EXPECT_STREQ(devices[2].name, "");  // beyond the count: untouched

  // A smaller capacity: the full count, only the first entry written.
  castmesh_device_info_v1 one[1]{};
  one[0].struct_size = sizeof one[0];
  ASSERT_EQ(record->query_devices(one, 1, &count, &error), CASTMESH_STATUS_OK);
  EXPECT_EQ(count, 2u);
  EXPECT_STREQ(one[0].name, "Test GPU 0");
}

TEST(TensorEngineBackend, NoDeviceSaysWhichVendorFoundNoneAndHow) {
  const castmesh_backend_v1* record = backend();
  castmesh_error_v1 error{};
  g_probe.count = 0;
  EXPECT_EQ(record->init(&error), CASTMESH_STATUS_NO_DEVICE);
  EXPECT_STREQ(error.message, "no FakeCUDA device (driver 12040, runtime 13000): testGetDeviceCount found 0 devices");

  g_probe.count_code = kNoDeviceCode;
  EXPECT_EQ(record->init(&error), CASTMESH_STATUS_NO_DEVICE);
  EXPECT_THAT(error.message, HasSubstr("no FakeCUDA device (driver 12040, runtime 13000): "));

  castmesh_device_info_v1 device{};
  device.struct_size = sizeof device;
  uint32_t count = 7;
  EXPECT_EQ(record->query_devices(&device, 1, &count, &error), CASTMESH_STATUS_NO_DEVICE);
  EXPECT_EQ(count, 0u);
  EXPECT_STREQ(error.message, "no FakeCUDA device");
}

TEST(TensorEngineBackend, AnotherCountFailureIsTheVendorsDriverMessage) {
  const castmesh_backend_v1* record = backend();
  castmesh_error_v1 error{};
  g_probe.count_code = kInsufficientDriver;
  g_probe.driver = 11000;
  EXPECT_EQ(record->init(&error), CASTMESH_STATUS_NO_DRIVER);
  EXPECT_STREQ(error.message, "test vendor: driver 11000 too old for runtime 13000 (code 35)");
  EXPECT_TRUE(g_log_lines.empty());
}

TEST(TensorEngineBackend, ADeviceThatCannotBeDescribedIsAnInternalErrorNamingTheCall) {
  const castmesh_backend_v1* record = backend();
  castmesh_error_v1 error{};
  ASSERT_EQ(record->init(&error), CASTMESH_STATUS_OK) << error.message;
  g_probe.describe_code = 1;  // cudaErrorInvalidValue
  castmesh_device_info_v1 devices[2]{};
  for (castmesh_device_info_v1& device : devices) device.struct_size = sizeof device;
  uint32_t count = 0;
  EXPECT_EQ(record->query_devices(devices, 2, &count, &error), CASTMESH_STATUS_INTERNAL);
  EXPECT_STREQ(error.message, "testGetDeviceProperties(0): invalid argument");
}

TEST(TensorEngineBackend, TheTableRunsTheEngineOverTheVendorsRuntimeAndCollectiveLibrary) {
  const castmesh_backend_v1* record = backend();
  const castmesh_tensor_engine_table_v1* te = record->tensor_engine;
  castmesh_error_v1 error{};
  castmesh_te_stream_v1* stream = nullptr;
  ASSERT_EQ(te->stream_create(1, &stream, &error), CASTMESH_STATUS_OK) << error.message;
  void* device = nullptr;
  ASSERT_EQ(te->device_alloc(1, 2 * sizeof(float), &device, &error), CASTMESH_STATUS_OK) << error.message;
  const float in[2] = {1.5f, -2.0f};
  ASSERT_EQ(te->copy(device, in, sizeof in, CASTMESH_TE_COPY_HOST_TO_DEVICE, stream, &error), CASTMESH_STATUS_OK);

  castmesh_te_unique_id_v1 id{};
  ASSERT_EQ(te->comm_unique_id(&id, &error), CASTMESH_STATUS_OK) << error.message;
  castmesh_te_comm_v1* comm = nullptr;
  ASSERT_EQ(te->comm_create(1, &id, 1, 0, &comm, &error), CASTMESH_STATUS_OK) << error.message;
  ASSERT_EQ(te->allreduce(comm, device, device, 2, CASTMESH_TE_DTYPE_FLOAT32, CASTMESH_TE_REDUCE_SUM, stream, &error),
            CASTMESH_STATUS_OK)
      << error.message;
  float out[2] = {0, 0};
  ASSERT_EQ(te->copy(out, device, sizeof out, CASTMESH_TE_COPY_DEVICE_TO_HOST, stream, &error), CASTMESH_STATUS_OK);
  ASSERT_EQ(te->stream_synchronize(stream, &error), CASTMESH_STATUS_OK) << error.message;
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.0f);

  // The engine's own checks answer through the table too.
  int32_t done = 0;
  EXPECT_EQ(te->event_query(nullptr, &done, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("unknown event handle"));

  EXPECT_EQ(te->comm_destroy(comm, &error), CASTMESH_STATUS_OK) << error.message;
  EXPECT_EQ(te->device_free(device, &error), CASTMESH_STATUS_OK) << error.message;
  EXPECT_EQ(te->stream_destroy(stream, &error), CASTMESH_STATUS_OK) << error.message;
}

}  // namespace
}  // namespace castmesh
