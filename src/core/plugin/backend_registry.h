// The backend registry: finds backend libraries, loads them through the C ABI
// and remembers what it found. castmesh::backends() / load_backend() use one
// process-wide instance; tests build their own with explicit search folders.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "castmesh/backend.h"
#include "castmesh/detail/mutex.h"

// Follows a `pip install "castmesh[...]"` in messages: castmesh has no PyPI
// release yet, so pip finds the plugin wheels only where they were built.
#define CASTMESH_WHEELS_HINT \
  "--find-links <castmesh's built wheels> (not on PyPI yet: README, section Python)"

namespace castmesh::plugin {

// Search folders (or library files) grouped by precedence: an earlier tier's
// backend shadows a later tier's backend of the same name.
using SearchTiers = std::vector<std::vector<std::string>>;

// Owns every library it has opened. Libraries are never dlclose()d (backends
// such as the static CUDA runtime register exit handlers inside the library),
// and a loaded backend's shutdown is not called at exit: its driver's own exit
// handlers clean up. shutdown is called when a backend initialised but then
// reported no device. All public members are thread-safe.
class BackendRegistry {
 public:
  // `search_tiers` is called at each (re)discovery to get the folders to scan.
  explicit BackendRegistry(std::function<SearchTiers()> search_tiers);
  ~BackendRegistry();
  BackendRegistry(const BackendRegistry&) = delete;
  BackendRegistry& operator=(const BackendRegistry&) = delete;

  // See castmesh::backends().
  std::vector<BackendInfo> backends();
  // See castmesh::load_backend().
  absl::StatusOr<const Backend*> load(std::string_view name_or_path);
  // Makes the next backends()/load() rescan the search folders. Libraries
  // already probed are not probed again.
  void forget_discovery();

 private:
  class LoadedLibrary;

  void discover_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Loads (once) and returns the probe result for one library file.
  const LoadedLibrary& probe_locked(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::function<SearchTiers()> search_tiers_;
  detail::Mutex mu_;
  bool discovered_ ABSL_GUARDED_BY(mu_) = false;
  // Probed libraries by canonical path.
  std::map<std::string, std::unique_ptr<LoadedLibrary>> libraries_ ABSL_GUARDED_BY(mu_);
  // Discovery result by backend name.
  std::map<std::string, BackendInfo> found_ ABSL_GUARDED_BY(mu_);
};

// The backend name a library file stands for: "libcastmesh_rdma.so" -> "rdma";
// empty if the file name does not follow that pattern.
std::string backend_name_from_file(std::string_view file_name);

// The default search tiers: CASTMESH_BACKEND_PATH, then folders added with
// add_backend_search_path(), then <folder of libcastmesh_core>/castmesh/backends.
SearchTiers default_search_tiers();

// The folder holding libcastmesh_core.so, found with dladdr(); empty if unknown.
std::string core_library_folder();

}  // namespace castmesh::plugin
