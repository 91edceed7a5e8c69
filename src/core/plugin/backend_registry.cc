#include "core/plugin/backend_registry.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/version.h"
#include "core/log/log.h"

namespace castmesh {

std::string_view backend_state_name(BackendState state) {
  switch (state) {
    case BackendState::kLoaded: return "loaded";
    case BackendState::kLibraryMissing: return "library missing";
    case BackendState::kNoDriver: return "no driver";
    case BackendState::kNoDevice: return "no device";
    case BackendState::kAbiMismatch: return "ABI mismatch";
    case BackendState::kInvalidLibrary: return "invalid library";
    case BackendState::kDuplicate: return "duplicate";
    case BackendState::kInitFailed: return "init failed";
  }
  return "unknown";
}

namespace plugin {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kFilePrefix = "libcastmesh_";
constexpr std::string_view kFileSuffix = ".so";
// Oldest minor version of ABI 1 this core accepts.
constexpr uint32_t kAbiMinorFloor = 0;
// A v1.0 backend table must reach at least to the end of query_devices.
constexpr size_t kMinBackendTableSize =
    offsetof(castmesh_backend_v1, query_devices) + sizeof(castmesh_backend_v1::query_devices);
constexpr uint32_t kMaxDevices = 64;

// How to get a well-known backend, and what its driver is.
struct KnownBackend {
  const char* name;
  const char* install_hint;
  const char* driver_hint;
};
constexpr KnownBackend kKnownBackends[] = {
    {"rdma",
     "pip install \"castmesh[rdma]\" " CASTMESH_WHEELS_HINT ", or build castmesh with -DCASTMESH_WITH_RDMA=ON and "
     "install it",
     "install the RDMA user-space libraries (Debian: apt-get install libibverbs1 ibverbs-providers)"},
    {"tensor_engine",
     "pip install \"castmesh[tensor-engine]\" " CASTMESH_WHEELS_HINT ", or build castmesh with "
     "-DCASTMESH_WITH_TENSOR_ENGINE=cuda (or hip) and install it",
     "install the NVIDIA driver (libcuda.so.1) or the ROCm runtime (libamdhip64.so)"},
};

const KnownBackend* known_backend(std::string_view name) {
  for (const KnownBackend& known : kKnownBackends) {
    if (name == known.name) return &known;
  }
  return nullptr;
}

std::string install_hint(std::string_view name) {
  if (const KnownBackend* known = known_backend(name)) return known->install_hint;
  return absl::StrCat("put libcastmesh_", std::string(name), ".so in a folder listed in CASTMESH_BACKEND_PATH");
}

// Host API handed to every backend.
void host_log(castmesh_log_level_v1 level, const char* backend_name, const char* message) {
  const char* who = backend_name != nullptr ? backend_name : "?";
  const char* what = message != nullptr ? message : "";
  switch (level) {
    case CASTMESH_LOG_LEVEL_DEBUG: CASTMESH_LOG_DEBUG("backend {}: {}", who, what); break;
    case CASTMESH_LOG_LEVEL_INFO: CASTMESH_LOG_INFO("backend {}: {}", who, what); break;
    case CASTMESH_LOG_LEVEL_WARN: CASTMESH_LOG_WARN("backend {}: {}", who, what); break;
    default: CASTMESH_LOG_ERROR("backend {}: {}", who, what); break;
  }
}

void* host_alloc(size_t size, size_t alignment) {
  if (alignment < alignof(std::max_align_t)) alignment = alignof(std::max_align_t);
  if ((alignment & (alignment - 1)) != 0) return nullptr;
  const size_t rounded = (size + alignment - 1) / alignment * alignment;
  return std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
}

void host_free(void* ptr) { std::free(ptr); }

const castmesh_host_api_v1& host_api() {
  static const castmesh_host_api_v1 api = {
      sizeof(castmesh_host_api_v1), CASTMESH_BACKEND_ABI_MAJOR, CASTMESH_BACKEND_ABI_MINOR,
      CASTMESH_VERSION_STRING,      &host_log,                  &host_alloc,
      &host_free,
  };
  return api;
}

// A C string field a backend filled in, bounded by its buffer size.
template <size_t N>
std::string bounded(const char (&field)[N]) {
  return std::string(field, strnlen(field, N));
}

BackendState state_from_status(int32_t code) {
  switch (code) {
    case CASTMESH_STATUS_NO_DRIVER: return BackendState::kNoDriver;
    case CASTMESH_STATUS_NO_DEVICE: return BackendState::kNoDevice;
    default: return BackendState::kInitFailed;
  }
}

absl::Status status_for(const BackendInfo& info) {
  const std::string message =
      absl::StrCat("backend '", info.name, "' is unavailable (", std::string(backend_state_name(info.state)),
                   "): ", info.message);
  switch (info.state) {
    case BackendState::kLoaded: return absl::OkStatus();
    case BackendState::kLibraryMissing: return absl::NotFoundError(message);
    case BackendState::kNoDriver:
    case BackendState::kNoDevice: return absl::UnavailableError(message);
    case BackendState::kAbiMismatch:
    case BackendState::kInvalidLibrary:
    case BackendState::kDuplicate: return absl::FailedPreconditionError(message);
    case BackendState::kInitFailed: return absl::InternalError(message);
  }
  return absl::InternalError(message);
}

void log_unavailable(const BackendInfo& info) {
  if (info.state == BackendState::kLoaded) {
    CASTMESH_LOG_INFO("backend {} {} loaded from {} ({} device(s))", info.name, info.version, info.path,
                      info.devices.size());
    return;
  }
  const bool expected_on_some_machines = info.state == BackendState::kLibraryMissing ||
                                         info.state == BackendState::kNoDriver ||
                                         info.state == BackendState::kNoDevice;
  if (expected_on_some_machines) {
    CASTMESH_LOG_INFO("backend {} unavailable ({}): {}", info.name, backend_state_name(info.state),
                      info.message);
  } else {
    CASTMESH_LOG_WARN("backend {} unavailable ({}): {}", info.name, backend_state_name(info.state),
                      info.message);
  }
}

// The library files a search entry names: the entry itself if it is a file,
// else the libcastmesh_<name>.so files in that folder, sorted.
std::vector<std::string> library_files(const std::string& entry) {
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_regular_file(entry, ec)) {
    files.push_back(entry);
    return files;
  }
  if (!fs::is_directory(entry, ec)) return files;
  for (const fs::directory_entry& child : fs::directory_iterator(entry, ec)) {
    const std::string file_name = child.path().filename().string();
    const std::string name = backend_name_from_file(file_name);
    if (name.empty() || name == "core") continue;
    files.push_back(child.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string canonical_or_same(const std::string& path) {
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(path, ec);
  return ec ? path : canonical.string();
}

}  // namespace

// One library file and what loading it gave. Implements castmesh::Backend
// once loaded. Immutable after construction (built under the registry lock).
class BackendRegistry::LoadedLibrary final : public Backend {
 public:
  explicit LoadedLibrary(const std::string& path) { load(path); }

  const BackendInfo& info() const override { return info_; }
  const castmesh_backend_v1& table() const override { return *table_; }

 private:
  void load(const std::string& path) {
    info_.path = path;
    info_.name = backend_name_from_file(fs::path(path).filename().string());
    if (info_.name.empty()) info_.name = fs::path(path).filename().string();
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      fail(BackendState::kLibraryMissing, absl::StrCat("no file ", path, "; ", install_hint(info_.name)));
      return;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* error = dlerror();
      classify_dlopen_failure(error != nullptr ? error : "unknown dlopen error");
      return;
    }
    dlerror();
    void* entry = dlsym(handle, CASTMESH_BACKEND_ENTRY_SYMBOL);
    if (entry == nullptr) {
      fail(BackendState::kInvalidLibrary,
           absl::StrCat(path, " is a shared library but exports no ", CASTMESH_BACKEND_ENTRY_SYMBOL,
                        ", so it is not a castmesh backend; remove it from the backend folders"));
      return;
    }
    auto init_entry = reinterpret_cast<castmesh_backend_init_v1_fn>(entry);
    const castmesh_backend_v1* table = init_entry(&host_api());
    if (!check_table(table)) return;
    table_ = table;
    info_.version = table->version != nullptr ? table->version : "";
    const std::string table_name = table->name != nullptr ? table->name : "";
    if (table_name != info_.name) {
      fail(BackendState::kInvalidLibrary,
           absl::StrCat(path, " reports backend name '", table_name, "' but its file name says '", info_.name,
                        "'; rename it to libcastmesh_", table_name, ".so"));
      return;
    }
    initialise();
  }

  bool check_table(const castmesh_backend_v1* table) {
    const std::string ours = absl::StrCat(CASTMESH_BACKEND_ABI_MAJOR, ".", CASTMESH_BACKEND_ABI_MINOR);
    const std::string fix = absl::StrCat("install the ", info_.name, " backend built for castmesh ",
                                         CASTMESH_VERSION_STRING, " (e.g. pip install castmesh-",
                                         info_.name == "tensor_engine" ? "tensor-engine" : info_.name, "==",
                                         CASTMESH_VERSION_STRING, ")");
    if (table == nullptr) {
      fail(BackendState::kAbiMismatch,
           absl::StrCat(info_.path, " refused this core's backend ABI ", ours, "; ", fix));
      return false;
    }
    if (table->struct_size < kMinBackendTableSize) {
      fail(BackendState::kAbiMismatch,
           absl::StrCat(info_.path, " has a backend table of ", table->struct_size, " bytes, ABI ", ours,
                        " needs at least ", kMinBackendTableSize, "; ", fix));
      return false;
    }
    if (table->abi_major != CASTMESH_BACKEND_ABI_MAJOR || table->abi_minor < kAbiMinorFloor) {
      fail(BackendState::kAbiMismatch,
           absl::StrCat(info_.path, " was built for backend ABI ", table->abi_major, ".", table->abi_minor,
                        ", this core accepts ", CASTMESH_BACKEND_ABI_MAJOR, ".", kAbiMinorFloor,
                        " or a later 1.x; ", fix));
      return false;
    }
    if (table->init == nullptr || table->shutdown == nullptr || table->query_devices == nullptr) {
      fail(BackendState::kInvalidLibrary,
           absl::StrCat(info_.path, " has a backend table with missing functions; ", fix));
      return false;
    }
    return true;
  }

  void initialise() {
    castmesh_error_v1 error{};
    const int32_t init_status = table_->init(&error);
    if (init_status != CASTMESH_STATUS_OK) {
      fail(state_from_status(init_status), bounded(error.message));
      return;
    }
    std::vector<castmesh_device_info_v1> devices(kMaxDevices);
    for (castmesh_device_info_v1& device : devices) device.struct_size = sizeof(castmesh_device_info_v1);
    uint32_t count = 0;
    error = castmesh_error_v1{};
    const int32_t query_status = table_->query_devices(devices.data(), kMaxDevices, &count, &error);
    if (query_status != CASTMESH_STATUS_OK) {
      table_->shutdown();
      fail(state_from_status(query_status), bounded(error.message));
      return;
    }
    count = std::min(count, kMaxDevices);
    for (uint32_t i = 0; i < count; ++i) {
      const castmesh_device_info_v1& device = devices[i];
      info_.devices.push_back(DeviceInfo{static_cast<castmesh_device_kind_v1>(device.kind), device.index,
                                         bounded(device.name), device.memory_bytes, bounded(device.detail)});
    }
    info_.state = BackendState::kLoaded;
    info_.message.clear();
  }

  // dlopen failed: either the file is not a usable library, or a library it
  // needs (its driver) is missing.
  void classify_dlopen_failure(std::string_view error) {
    // glibc: "<needed>: cannot open shared object file: No such file or directory"
    constexpr std::string_view kMissing = ": cannot open shared object file";
    const size_t at = error.find(kMissing);
    if (at != std::string_view::npos) {
      const std::string needed(error.substr(0, at));
      if (fs::path(needed).filename() != fs::path(info_.path).filename()) {
        const KnownBackend* known = known_backend(info_.name);
        fail(BackendState::kNoDriver,
             absl::StrCat(info_.path, " needs ", needed, ", which is not installed here; ",
                          known != nullptr ? known->driver_hint : "install the library it depends on"));
        return;
      }
    }
    fail(BackendState::kInvalidLibrary,
         absl::StrCat(info_.path, " is not a loadable library (", std::string(error),
                      "); remove it or replace it with ",
                      "a backend built for this machine"));
  }

  void fail(BackendState state, std::string message) {
    info_.state = state;
    info_.message = std::move(message);
    table_ = nullptr;
  }

  BackendInfo info_;
  const castmesh_backend_v1* table_ = nullptr;
};

BackendRegistry::BackendRegistry(std::function<SearchTiers()> search_tiers)
    : search_tiers_(std::move(search_tiers)) {}

BackendRegistry::~BackendRegistry() = default;

const BackendRegistry::LoadedLibrary& BackendRegistry::probe_locked(const std::string& path) {
  const std::string key = canonical_or_same(path);
  auto it = libraries_.find(key);
  if (it == libraries_.end()) {
    it = libraries_.emplace(key, std::make_unique<LoadedLibrary>(path)).first;
    log_unavailable(it->second->info());
  }
  return *it->second;
}

void BackendRegistry::discover_locked() {
  if (discovered_) return;
  found_.clear();
  for (const std::vector<std::string>& tier : search_tiers_()) {
    // Candidates of this tier by backend name; names owned by an earlier tier
    // are shadowed.
    std::map<std::string, std::vector<std::string>> candidates;
    for (const std::string& entry : tier) {
      for (const std::string& file : library_files(entry)) {
        std::string name = backend_name_from_file(fs::path(file).filename().string());
        if (name.empty()) name = fs::path(file).filename().string();
        if (found_.count(name) != 0) {
          CASTMESH_LOG_DEBUG("backend {} at {} is shadowed by {}", name, file, found_[name].path);
          continue;
        }
        std::vector<std::string>& paths = candidates[name];
        const std::string canonical = canonical_or_same(file);
        const bool seen = std::any_of(paths.begin(), paths.end(),
                                      [&](const std::string& p) { return canonical_or_same(p) == canonical; });
        if (!seen) paths.push_back(file);
      }
    }
    for (const auto& [name, paths] : candidates) {
      if (paths.size() > 1) {
        BackendInfo duplicate;
        duplicate.name = name;
        duplicate.state = BackendState::kDuplicate;
        duplicate.path = paths.front();
        duplicate.message = absl::StrCat("found ", paths.size(), " libraries for backend '", name,
                                         "' in one search tier: ", absl::StrJoin(paths, ", "),
                                         "; remove all but one (or put the one to use first in "
                                         "CASTMESH_BACKEND_PATH)");
        log_unavailable(duplicate);
        found_[name] = std::move(duplicate);
        continue;
      }
      found_[name] = probe_locked(paths.front()).info();
    }
  }
  for (const KnownBackend& known : kKnownBackends) {
    const std::string name(known.name);
    if (found_.count(name) != 0) continue;
    BackendInfo missing;
    missing.name = name;
    missing.state = BackendState::kLibraryMissing;
    missing.message = absl::StrCat("no libcastmesh_", name, ".so in the backend folders; ", known.install_hint);
    log_unavailable(missing);
    found_[name] = std::move(missing);
  }
  discovered_ = true;
}

std::vector<BackendInfo> BackendRegistry::backends() {
  detail::MutexLock lock(mu_);
  discover_locked();
  std::vector<BackendInfo> result;
  result.reserve(found_.size());
  for (const auto& [name, info] : found_) result.push_back(info);
  return result;
}

absl::StatusOr<const Backend*> BackendRegistry::load(std::string_view name_or_path) {
  detail::MutexLock lock(mu_);
  if (name_or_path.find('/') != std::string_view::npos) {
    const LoadedLibrary& library = probe_locked(std::string(name_or_path));
    if (library.info().state != BackendState::kLoaded) return status_for(library.info());
    return &library;
  }
  discover_locked();
  const std::string name(name_or_path);
  auto it = found_.find(name);
  if (it == found_.end()) {
    BackendInfo missing;
    missing.name = name;
    missing.state = BackendState::kLibraryMissing;
    missing.message = absl::StrCat("no libcastmesh_", name, ".so in the backend folders; ", install_hint(name));
    return status_for(missing);
  }
  if (it->second.state != BackendState::kLoaded) return status_for(it->second);
  return libraries_.at(canonical_or_same(it->second.path)).get();
}

void BackendRegistry::forget_discovery() {
  detail::MutexLock lock(mu_);
  discovered_ = false;
}

std::string backend_name_from_file(std::string_view file_name) {
  if (!file_name.starts_with(kFilePrefix) || !file_name.ends_with(kFileSuffix)) return "";
  if (file_name.size() <= kFilePrefix.size() + kFileSuffix.size()) return "";
  return std::string(file_name.substr(kFilePrefix.size(), file_name.size() - kFilePrefix.size() - kFileSuffix.size()));
}

std::string core_library_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&core_library_folder), &info) == 0 || info.dli_fname == nullptr) return "";
  std::error_code ec;
  const fs::path library = fs::weakly_canonical(info.dli_fname, ec);
  return (ec ? fs::path(info.dli_fname) : library).parent_path().string();
}

namespace {

detail::Mutex added_paths_mu;
std::vector<std::string>& added_paths() ABSL_EXCLUSIVE_LOCKS_REQUIRED(added_paths_mu) {
  static std::vector<std::string> paths;
  return paths;
}

// Never destroyed: loaded backends stay usable until the very end of the
// process, whatever order static destructors and driver exit handlers run in.
BackendRegistry& process_registry() {
  static BackendRegistry* const registry = new BackendRegistry(&default_search_tiers);
  return *registry;
}

}  // namespace

SearchTiers default_search_tiers() {
  SearchTiers tiers(3);
  if (const char* env = std::getenv("CASTMESH_BACKEND_PATH"); env != nullptr) {
    for (absl::string_view entry : absl::StrSplit(env, ':', absl::SkipEmpty())) tiers[0].emplace_back(entry);
  }
  {
    detail::MutexLock lock(added_paths_mu);
    tiers[1] = added_paths();
  }
  const std::string core_folder = core_library_folder();
  if (!core_folder.empty()) tiers[2].push_back((fs::path(core_folder) / "castmesh" / "backends").string());
  return tiers;
}

}  // namespace plugin

std::vector<BackendInfo> backends() { return plugin::process_registry().backends(); }

const castmesh_rdma_table_v1* rdma_table(const castmesh_backend_v1& table) {
  // The struct_size rule: a 1.0 writer's table ends before the rdma field.
  if (table.struct_size < offsetof(castmesh_backend_v1, rdma) + sizeof table.rdma) return nullptr;
  const castmesh_rdma_table_v1* rdma = table.rdma;
  if (rdma == nullptr || rdma->struct_size < offsetof(castmesh_rdma_table_v1, poll) + sizeof rdma->poll) {
    return nullptr;
  }
  const bool complete = rdma->open_device != nullptr && rdma->close_device != nullptr &&
                        rdma->register_memory != nullptr && rdma->deregister_memory != nullptr &&
                        rdma->create_endpoint != nullptr && rdma->connect_endpoint != nullptr &&
                        rdma->destroy_endpoint != nullptr && rdma->post != nullptr && rdma->poll != nullptr;
  return complete ? rdma : nullptr;
}

const castmesh_rdma_table_v1* rdma_table(const Backend& backend) { return rdma_table(backend.table()); }

const castmesh_tensor_engine_table_v1* tensor_engine_table(const castmesh_backend_v1& table) {
  if (table.struct_size < offsetof(castmesh_backend_v1, tensor_engine) + sizeof table.tensor_engine) return nullptr;
  const castmesh_tensor_engine_table_v1* te = table.tensor_engine;
  if (te == nullptr || te->struct_size < offsetof(castmesh_tensor_engine_table_v1, group_end) + sizeof te->group_end) {
    return nullptr;
  }
  // Every entry is mandatory: a caller must never find a NULL function.
  using Entry = void (*)();
  const Entry entries[] = {
      reinterpret_cast<Entry>(te->device_alloc),     reinterpret_cast<Entry>(te->device_free),
      reinterpret_cast<Entry>(te->pinned_alloc),     reinterpret_cast<Entry>(te->pinned_free),
      reinterpret_cast<Entry>(te->stream_create),    reinterpret_cast<Entry>(te->stream_destroy),
      reinterpret_cast<Entry>(te->stream_query),     reinterpret_cast<Entry>(te->stream_synchronize),
      reinterpret_cast<Entry>(te->event_create),     reinterpret_cast<Entry>(te->event_destroy),
      reinterpret_cast<Entry>(te->event_record),     reinterpret_cast<Entry>(te->event_query),
      reinterpret_cast<Entry>(te->event_synchronize), reinterpret_cast<Entry>(te->stream_wait_event),
      reinterpret_cast<Entry>(te->copy),             reinterpret_cast<Entry>(te->comm_unique_id),
      reinterpret_cast<Entry>(te->comm_create),      reinterpret_cast<Entry>(te->comm_destroy),
      reinterpret_cast<Entry>(te->comm_abort),       reinterpret_cast<Entry>(te->comm_async_error),
      reinterpret_cast<Entry>(te->allreduce),        reinterpret_cast<Entry>(te->broadcast),
      reinterpret_cast<Entry>(te->allgather),        reinterpret_cast<Entry>(te->reduce_scatter),
      reinterpret_cast<Entry>(te->send),             reinterpret_cast<Entry>(te->recv),
      reinterpret_cast<Entry>(te->group_begin),      reinterpret_cast<Entry>(te->group_end),
  };
  for (const Entry entry : entries) {
    if (entry == nullptr) return nullptr;
  }
  return te;
}

const castmesh_tensor_engine_table_v1* tensor_engine_table(const Backend& backend) {
  return tensor_engine_table(backend.table());
}

absl::StatusOr<const Backend*> load_backend(std::string_view name_or_path) {
  return plugin::process_registry().load(name_or_path);
}

void add_backend_search_path(std::string path) {
  {
    detail::MutexLock lock(plugin::added_paths_mu);
    std::vector<std::string>& paths = plugin::added_paths();
    if (std::find(paths.begin(), paths.end(), path) != paths.end()) return;
    paths.push_back(std::move(path));
  }
  plugin::process_registry().forget_discovery();
}

}  // namespace castmesh
