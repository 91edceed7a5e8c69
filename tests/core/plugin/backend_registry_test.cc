#include "core/plugin/backend_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "castmesh/backend.h"
#include "castmesh/version.h"

namespace castmesh::plugin {
namespace {

using ::testing::HasSubstr;

std::string plugin_dir(const std::string& folder) { return std::string(CASTMESH_TEST_PLUGIN_DIR) + "/" + folder; }

BackendInfo find(const std::vector<BackendInfo>& all, const std::string& name) {
  for (const BackendInfo& info : all) {
    if (info.name == name) return info;
  }
  ADD_FAILURE() << "backend " << name << " not listed";
  return {};
}

TEST(BackendRegistry, LoadsAWorkingBackendAndItsDevices) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("good")}}; });
  const BackendInfo info = find(registry.backends(), "test_good");
  EXPECT_EQ(info.state, BackendState::kLoaded) << info.message;
  EXPECT_EQ(info.version, "9.9.9");
  EXPECT_EQ(info.path, plugin_dir("good") + "/libcastmesh_test_good.so");
  ASSERT_EQ(info.devices.size(), 1u);
  EXPECT_EQ(info.devices[0].name, "test-device-0");
  EXPECT_EQ(info.devices[0].memory_bytes, 1024u);
  // The backend read the core version through the host API table.
  EXPECT_EQ(info.devices[0].detail, std::string("core=") + CASTMESH_VERSION_STRING);

  absl::StatusOr<const Backend*> loaded = registry.load("test_good");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_STREQ((*loaded)->table().name, "test_good");
  EXPECT_EQ((*loaded)->info().devices.size(), 1u);
}

TEST(BackendRegistry, ReportsEveryDeviceOfABackend) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("two_devices")}}; });
  const BackendInfo info = find(registry.backends(), "test_two");
  ASSERT_EQ(info.state, BackendState::kLoaded) << info.message;
  ASSERT_EQ(info.devices.size(), 2u);
  EXPECT_EQ(info.devices[1].name, "test-device-1");
  EXPECT_EQ(info.devices[1].index, 1);
  EXPECT_EQ(info.devices[1].memory_bytes, 2048u);
}

TEST(BackendRegistry, ListsWellKnownBackendsThatAreMissingWithHowToInstall) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("empty-folder-that-does-not-exist")}}; });
  const std::vector<BackendInfo> all = registry.backends();
  ASSERT_EQ(all.size(), 2u);
  const BackendInfo rdma = find(all, "rdma");
  EXPECT_EQ(rdma.state, BackendState::kLibraryMissing);
  EXPECT_THAT(rdma.message, HasSubstr("pip install \"castmesh[rdma]\""));
  EXPECT_TRUE(rdma.path.empty());
  const BackendInfo tensor_engine = find(all, "tensor_engine");
  EXPECT_EQ(tensor_engine.state, BackendState::kLibraryMissing);
  EXPECT_THAT(tensor_engine.message, HasSubstr("castmesh[tensor-engine]"));

  absl::StatusOr<const Backend*> loaded = registry.load("rdma");
  ASSERT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("castmesh[rdma]"));
}

TEST(BackendRegistry, UnknownNameIsNotFoundWithTheSearchVariableNamed) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("good")}}; });
  absl::StatusOr<const Backend*> loaded = registry.load("no_such_backend");
  ASSERT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("CASTMESH_BACKEND_PATH"));
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("libcastmesh_no_such_backend.so"));
}

TEST(BackendRegistry, BackendWithoutDeviceIsUnavailable) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("nodevice")}}; });
  const BackendInfo info = find(registry.backends(), "test_nodevice");
  EXPECT_EQ(info.state, BackendState::kNoDevice);
  EXPECT_EQ(info.message, "test backend has no device");
  EXPECT_TRUE(info.devices.empty());
  absl::StatusOr<const Backend*> loaded = registry.load("test_nodevice");
  ASSERT_EQ(loaded.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("no device"));
}

TEST(BackendRegistry, BackendWhoseInitFindsNoDriverIsUnavailable) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("nodriver")}}; });
  const BackendInfo info = find(registry.backends(), "test_nodriver");
  EXPECT_EQ(info.state, BackendState::kNoDriver);
  EXPECT_THAT(info.message, HasSubstr("test backend init says 1"));
  EXPECT_EQ(registry.load("test_nodriver").status().code(), absl::StatusCode::kUnavailable);
}

TEST(BackendRegistry, BackendWhoseInitFailsIsAnInternalError) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("initfails")}}; });
  EXPECT_EQ(find(registry.backends(), "test_initfails").state, BackendState::kInitFailed);
  EXPECT_EQ(registry.load("test_initfails").status().code(), absl::StatusCode::kInternal);
}

TEST(BackendRegistry, MissingDriverLibraryIsReportedAsNoDriver) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("needsdep")}}; });
  const BackendInfo info = find(registry.backends(), "test_needsdep");
  EXPECT_EQ(info.state, BackendState::kNoDriver);
  EXPECT_THAT(info.message, HasSubstr("libcastmesh_test_dep.so"));
  EXPECT_THAT(info.message, HasSubstr("not installed"));
  EXPECT_EQ(registry.load("test_needsdep").status().code(), absl::StatusCode::kUnavailable);
}

TEST(BackendRegistry, WrongAbiMajorIsRejected) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("badabi")}}; });
  const BackendInfo info = find(registry.backends(), "test_badabi");
  EXPECT_EQ(info.state, BackendState::kAbiMismatch);
  EXPECT_THAT(info.message, HasSubstr("backend ABI 99.0"));
  EXPECT_THAT(info.message, HasSubstr(CASTMESH_VERSION_STRING));
  absl::StatusOr<const Backend*> loaded = registry.load("test_badabi");
  ASSERT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("ABI mismatch"));
}

TEST(BackendRegistry, TruncatedTableIsRejected) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("smalltable")}}; });
  const BackendInfo info = find(registry.backends(), "test_smalltable");
  EXPECT_EQ(info.state, BackendState::kAbiMismatch);
  EXPECT_THAT(info.message, HasSubstr("backend table of 8 bytes"));
}

TEST(BackendRegistry, AnAbi10BackendStillLoadsAndHasNoRdmaTable) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("abi10")}}; });
  absl::StatusOr<const Backend*> loaded = registry.load("test_abi10");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const castmesh_backend_v1& table = (*loaded)->table();
  EXPECT_EQ(table.abi_minor, 0u);
  EXPECT_EQ(table.struct_size, offsetof(castmesh_backend_v1, rdma));
  EXPECT_EQ((*loaded)->info().devices.size(), 1u);
  // The field lies past the 1.0 table: the accessor must not read it.
  EXPECT_EQ(rdma_table(**loaded), nullptr);
}

TEST(BackendRegistry, AnAbi11BackendWithoutRdmaHasNoRdmaTable) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("good")}}; });
  absl::StatusOr<const Backend*> loaded = registry.load("test_good");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->table().abi_minor, static_cast<uint32_t>(CASTMESH_BACKEND_ABI_MINOR));
  EXPECT_EQ(rdma_table(**loaded), nullptr);
}

TEST(BackendRegistry, AnAbi11BackendOffersItsRdmaTable) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("withrdma")}}; });
  absl::StatusOr<const Backend*> loaded = registry.load("test_withrdma");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const castmesh_rdma_table_v1* rdma = rdma_table(**loaded);
  ASSERT_NE(rdma, nullptr);
  castmesh_rdma_device_v1* device = nullptr;
  castmesh_error_v1 error{};
  EXPECT_EQ(rdma->open_device(nullptr, 1, 0, &device, &error), CASTMESH_STATUS_UNIMPLEMENTED);
  EXPECT_STREQ(error.message, "test_withrdma has no NIC");
}

TEST(BackendRegistry, AnRdmaTableTooShortForAbi11IsIgnored) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("shortrdma")}}; });
  absl::StatusOr<const Backend*> loaded = registry.load("test_shortrdma");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_NE((*loaded)->table().rdma, nullptr);
  EXPECT_EQ(rdma_table(**loaded), nullptr);
}

TEST(BackendRegistry, AnAbi10BackendHasNoTensorEngineTable) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("abi10")}}; });
  absl::StatusOr<const Backend*> loaded = registry.load("test_abi10");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(tensor_engine_table(**loaded), nullptr);
}

TEST(BackendRegistry, AnRdmaEraAbi11BackendKeepsItsRdmaTableAndHasNoTensorEngineTable) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("rdmaera")}}; });
  absl::StatusOr<const Backend*> loaded = registry.load("test_rdmaera");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->table().struct_size, offsetof(castmesh_backend_v1, tensor_engine));
  EXPECT_NE(rdma_table(**loaded), nullptr);
  // The field lies past this table: the accessor must not read it.
  EXPECT_EQ(tensor_engine_table(**loaded), nullptr);
}

TEST(BackendRegistry, AnAbi11BackendOffersItsTensorEngineTable) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("withte")}}; });
  absl::StatusOr<const Backend*> loaded = registry.load("test_withte");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(rdma_table(**loaded), nullptr);
  const castmesh_tensor_engine_table_v1* te = tensor_engine_table(**loaded);
  ASSERT_NE(te, nullptr);
  void* ptr = &ptr;
  castmesh_error_v1 error{};
  EXPECT_EQ(te->device_alloc(0, 64, &ptr, &error), CASTMESH_STATUS_UNIMPLEMENTED);
  EXPECT_EQ(ptr, nullptr);
  EXPECT_STREQ(error.message, "test_withte has no device memory");
}

TEST(BackendRegistry, ATensorEngineTableTooShortForAbi11IsIgnored) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("shortte")}}; });
  absl::StatusOr<const Backend*> loaded = registry.load("test_shortte");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_NE((*loaded)->table().tensor_engine, nullptr);
  EXPECT_EQ(tensor_engine_table(**loaded), nullptr);
}

TEST(BackendRegistry, LibraryWithoutEntrySymbolIsRejected) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("noentry")}}; });
  const BackendInfo info = find(registry.backends(), "test_noentry");
  EXPECT_EQ(info.state, BackendState::kInvalidLibrary);
  EXPECT_THAT(info.message, HasSubstr("castmesh_backend_init_v1"));
  EXPECT_EQ(registry.load("test_noentry").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(BackendRegistry, FileThatIsNotALibraryIsRejectedWithoutCrashing) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("notalib")}}; });
  const BackendInfo info = find(registry.backends(), "test_notalib");
  EXPECT_EQ(info.state, BackendState::kInvalidLibrary);
  EXPECT_THAT(info.message, HasSubstr("not a loadable library"));
  EXPECT_EQ(registry.load("test_notalib").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(BackendRegistry, FileNameMustMatchTheBackendName) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("misnamed")}}; });
  const BackendInfo info = find(registry.backends(), "other_name");
  EXPECT_EQ(info.state, BackendState::kInvalidLibrary);
  EXPECT_THAT(info.message, HasSubstr("rename it to libcastmesh_test_misnamed.so"));
}

TEST(BackendRegistry, TwoLibrariesWithOneNameInOneTierAreAnError) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("good"), plugin_dir("good_copy")}}; });
  const BackendInfo info = find(registry.backends(), "test_good");
  EXPECT_EQ(info.state, BackendState::kDuplicate);
  EXPECT_THAT(info.message, HasSubstr(plugin_dir("good") + "/libcastmesh_test_good.so"));
  EXPECT_THAT(info.message, HasSubstr(plugin_dir("good_copy") + "/libcastmesh_test_good.so"));
  EXPECT_EQ(registry.load("test_good").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(BackendRegistry, TheSameFolderListedTwiceIsNotADuplicate) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("good"), plugin_dir("good") + "/"}}; });
  EXPECT_EQ(find(registry.backends(), "test_good").state, BackendState::kLoaded);
}

TEST(BackendRegistry, AnEarlierTierShadowsALaterOne) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("good_copy")}, {plugin_dir("good")}}; });
  const BackendInfo info = find(registry.backends(), "test_good");
  EXPECT_EQ(info.state, BackendState::kLoaded) << info.message;
  EXPECT_EQ(info.path, plugin_dir("good_copy") + "/libcastmesh_test_good.so");
}

TEST(BackendRegistry, ASearchEntryMayBeALibraryFile) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("two_devices") + "/libcastmesh_test_two.so"}}; });
  EXPECT_EQ(find(registry.backends(), "test_two").state, BackendState::kLoaded);
}

TEST(BackendRegistry, LoadsAnExplicitPathOutsideTheSearchFolders) {
  BackendRegistry registry([] { return SearchTiers{}; });
  absl::StatusOr<const Backend*> loaded = registry.load(plugin_dir("two_devices") + "/libcastmesh_test_two.so");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->info().devices.size(), 2u);

  absl::StatusOr<const Backend*> missing = registry.load(plugin_dir("nowhere") + "/libcastmesh_x.so");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<const Backend*> bad = registry.load(plugin_dir("badabi") + "/libcastmesh_test_badabi.so");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(BackendRegistry, ForgettingDiscoveryPicksUpNewFolders) {
  std::vector<std::string> folders;
  BackendRegistry registry([&folders] { return SearchTiers{folders}; });
  EXPECT_EQ(registry.load("test_good").status().code(), absl::StatusCode::kNotFound);
  folders.push_back(plugin_dir("good"));
  EXPECT_EQ(registry.load("test_good").status().code(), absl::StatusCode::kNotFound) << "discovery is cached";
  registry.forget_discovery();
  EXPECT_TRUE(registry.load("test_good").ok());
}

TEST(BackendRegistry, ConcurrentCallersSeeOneConsistentResult) {
  BackendRegistry registry([] { return SearchTiers{{plugin_dir("good"), plugin_dir("nodevice")}}; });
  std::vector<std::thread> threads;
  std::vector<int> loaded_count(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&registry, &loaded_count, t] {
      for (int i = 0; i < 20; ++i) {
        if (registry.load("test_good").ok()) ++loaded_count[t];
        if (find(registry.backends(), "test_nodevice").state == BackendState::kNoDevice) ++loaded_count[t];
        if (i % 5 == 0) registry.forget_discovery();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(loaded_count, std::vector<int>(4, 40));
}

TEST(BackendFileName, FollowsTheLibcastmeshPattern) {
  EXPECT_EQ(backend_name_from_file("libcastmesh_rdma.so"), "rdma");
  EXPECT_EQ(backend_name_from_file("libcastmesh_tensor_engine.so"), "tensor_engine");
  EXPECT_EQ(backend_name_from_file("libcastmesh_.so"), "");
  EXPECT_EQ(backend_name_from_file("librdma.so"), "");
  EXPECT_EQ(backend_name_from_file("libcastmesh_rdma.so.1"), "");
}

TEST(BackendStateName, NamesEveryState) {
  EXPECT_EQ(backend_state_name(BackendState::kLoaded), "loaded");
  EXPECT_EQ(backend_state_name(BackendState::kLibraryMissing), "library missing");
  EXPECT_EQ(backend_state_name(BackendState::kAbiMismatch), "ABI mismatch");
}

// The process-wide API: CASTMESH_BACKEND_PATH, add_backend_search_path and the
// backends built in this tree (found next to libcastmesh_core).
TEST(ProcessBackends, AddedSearchPathIsFound) {
  add_backend_search_path(plugin_dir("two_devices"));
  absl::StatusOr<const Backend*> loaded = load_backend("test_two");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->info().devices.size(), 2u);
}

TEST(ProcessBackends, EnvironmentSearchPathIsFound) {
  ASSERT_EQ(setenv("CASTMESH_BACKEND_PATH", (plugin_dir("nodevice") + ":" + plugin_dir("good")).c_str(), 1), 0);
  const std::vector<BackendInfo> all = backends();
  EXPECT_EQ(find(all, "test_good").state, BackendState::kLoaded);
  EXPECT_EQ(find(all, "test_nodevice").state, BackendState::kNoDevice);
  EXPECT_TRUE(load_backend("test_good").ok());
}

TEST(ProcessBackends, CoreFolderIsKnown) {
  const std::string folder = core_library_folder();
  ASSERT_FALSE(folder.empty());
  EXPECT_TRUE(std::filesystem::exists(folder + "/libcastmesh_core.so")) << folder;
}

#ifdef CASTMESH_TEST_HAVE_RDMA
TEST(ProcessBackends, RdmaBackendBuiltHereIsFoundAndReportsDevicesOrNoDevice) {
  const BackendInfo rdma = find(backends(), "rdma");
  EXPECT_EQ(rdma.path, core_library_folder() + "/castmesh/backends/libcastmesh_rdma.so");
  if (rdma.state == BackendState::kLoaded) {
    EXPECT_FALSE(rdma.devices.empty());
    for (const DeviceInfo& device : rdma.devices) EXPECT_EQ(device.kind, CASTMESH_DEVICE_KIND_RDMA_NIC);
    absl::StatusOr<const Backend*> loaded = load_backend("rdma");
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_NE(rdma_table(**loaded), nullptr);
  } else {
    // Machines without an RDMA NIC (CI): a clean "no device" with the reason.
    EXPECT_EQ(rdma.state, BackendState::kNoDevice) << rdma.message;
    EXPECT_THAT(rdma.message, HasSubstr("no RDMA device"));
    EXPECT_EQ(load_backend("rdma").status().code(), absl::StatusCode::kUnavailable);
  }
}
#endif

#ifdef CASTMESH_TEST_HAVE_RDMA
// Whether or not a NIC exists, the rdma library built here offers a whole 1.1
// rdma table (read straight from its entry point, since without a NIC the
// registry does not hand the backend out).
TEST(ProcessBackends, RdmaBackendBuiltHereOffersAnAbi11RdmaTable) {
  const std::string path = core_library_folder() + "/castmesh/backends/libcastmesh_rdma.so";
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(library, nullptr) << dlerror();
  auto entry = reinterpret_cast<castmesh_backend_init_v1_fn>(dlsym(library, CASTMESH_BACKEND_ENTRY_SYMBOL));
  ASSERT_NE(entry, nullptr);
  static castmesh_host_api_v1 host{};  // the plugin keeps the pointer
  host.struct_size = sizeof host;
  host.abi_major = CASTMESH_BACKEND_ABI_MAJOR;
  host.abi_minor = CASTMESH_BACKEND_ABI_MINOR;
  host.core_version = CASTMESH_VERSION_STRING;
  host.host_alloc = [](size_t size, size_t alignment) { return std::aligned_alloc(alignment, size); };
  host.host_free = [](void* ptr) { std::free(ptr); };
  const castmesh_backend_v1* table = entry(&host);
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->abi_minor, 1u);
  const castmesh_rdma_table_v1* rdma = rdma_table(*table);
  ASSERT_NE(rdma, nullptr);
  EXPECT_EQ(rdma->struct_size, sizeof(castmesh_rdma_table_v1));
  // Libraries stay loaded, as the registry keeps them.
}
#endif

#ifdef CASTMESH_TEST_HAVE_TENSOR_ENGINE
TEST(ProcessBackends, TensorEngineBuiltHereIsFoundAndReportsDevicesOrWhyNot) {
  const BackendInfo te = find(backends(), "tensor_engine");
  EXPECT_EQ(te.path, core_library_folder() + "/castmesh/backends/libcastmesh_tensor_engine.so");
  if (te.state == BackendState::kLoaded) {
    ASSERT_FALSE(te.devices.empty());
    EXPECT_THAT(te.devices[0].detail, HasSubstr("compute_capability="));
    EXPECT_GT(te.devices[0].memory_bytes, 0u);
  } else {
    // No GPU (CI): the driver or the device is missing, and the message says which.
    EXPECT_TRUE(te.state == BackendState::kNoDriver || te.state == BackendState::kNoDevice)
        << backend_state_name(te.state) << ": " << te.message;
    EXPECT_THAT(te.message, ::testing::AnyOf(HasSubstr("no CUDA driver"), HasSubstr("no CUDA device"),
                                             HasSubstr("HIP")));
  }
}

// The CUDA and HIP builds offer a complete tensor_engine table even on
// machines without a GPU (it is read from the raw table: the registry does not
// load a backend without devices). Handle checks need no runtime call.
TEST(ProcessBackends, TheTensorEngineOffersItsTable) {
  const std::string path = core_library_folder() + "/castmesh/backends/libcastmesh_tensor_engine.so";
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(library, nullptr) << dlerror();
  auto init = reinterpret_cast<castmesh_backend_init_v1_fn>(dlsym(library, CASTMESH_BACKEND_ENTRY_SYMBOL));
  ASSERT_NE(init, nullptr);
  static castmesh_host_api_v1 host{};  // the plugin keeps the pointer
  host.struct_size = sizeof host;
  host.abi_major = CASTMESH_BACKEND_ABI_MAJOR;
  host.abi_minor = CASTMESH_BACKEND_ABI_MINOR;
  host.core_version = "test";
  const castmesh_backend_v1* table = init(&host);
  ASSERT_NE(table, nullptr);
  const std::string version = table->version;
  EXPECT_TRUE(version.ends_with("+cuda") || version.ends_with("+hip")) << version;
  const castmesh_tensor_engine_table_v1* te = tensor_engine_table(*table);
  ASSERT_NE(te, nullptr);
  castmesh_error_v1 error{};
  int32_t done = 0;
  EXPECT_EQ(te->stream_query(nullptr, &done, &error), CASTMESH_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(error.message, HasSubstr("unknown stream handle"));
}
#endif

}  // namespace
}  // namespace castmesh::plugin
