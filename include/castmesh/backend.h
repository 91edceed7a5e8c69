// Discovering and loading backend plugins (tensor_engine, rdma, ...).
//
// Backends are shared libraries loaded at run time through the C ABI in
// castmesh/backend_abi.h. Discovery is lazy (first call to backends() or
// load_backend()) and searches, in order:
//   1. the files and folders in CASTMESH_BACKEND_PATH (':'-separated);
//   2. folders registered with add_backend_search_path() (the Python package
//      registers the folders of installed plugin wheels, found through the
//      `castmesh.backends` entry points);
//   3. <folder of libcastmesh_core.so>/castmesh/backends/ (the install layout).
// A folder is scanned for files named libcastmesh_<name>.so. The first tier
// that holds a backend name wins (so CASTMESH_BACKEND_PATH overrides an
// installed backend); two libraries with the same backend name in one tier
// are an error for that name.
//
// All functions here are thread-safe and may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "castmesh/backend_abi.h"

namespace castmesh {

// Why a backend is or is not usable.
enum class BackendState {
  kLoaded,          // library loaded, initialised, at least one device
  kLibraryMissing,  // no library for this backend in any search folder
  kNoDriver,        // library found but a driver / system library it needs is missing
  kNoDevice,        // driver present but no device
  kAbiMismatch,     // library speaks another ABI version than this core
  kInvalidLibrary,  // not a loadable library, or no castmesh entry symbol
  kDuplicate,       // two libraries claim this name in one search folder tier
  kInitFailed,      // the backend's init reported another error
};

// Short lower-case name of a state ("loaded", "no device", ...).
std::string_view backend_state_name(BackendState state);

// One device reported by a backend's capability query.
struct DeviceInfo {
  castmesh_device_kind_v1 kind = CASTMESH_DEVICE_KIND_OTHER;
  int index = 0;
  std::string name;
  std::uint64_t memory_bytes = 0;
  std::string detail;  // "key=value ..." facts, backend specific
};

// What discovery found about one backend name. A plain value; copy freely.
struct BackendInfo {
  std::string name;
  BackendState state = BackendState::kLibraryMissing;
  std::string path;     // library file; empty when the library is missing
  std::string version;  // backend's version string, when it could be read
  // For every state but kLoaded: one sentence saying what is wrong and how to
  // fix it (e.g. `pip install "castmesh[rdma]"`).
  std::string message;
  std::vector<DeviceInfo> devices;
};

// Every backend found, plus the well-known ones (rdma, tensor_engine) that
// were not found, each with its state. Sorted by name. Runs discovery on
// first use; later calls return the cached result.
std::vector<BackendInfo> backends();

// A loaded, initialised backend. Owned by the core for the life of the
// process (libraries are never unloaded); the pointer stays valid until exit.
// The table's functions follow the threading rules of backend_abi.h.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const BackendInfo& info() const = 0;
  virtual const castmesh_backend_v1& table() const = 0;
};

// The backend's one-sided RDMA table (ABI 1.1), or nullptr when the backend
// has none: a 1.0 backend (its struct_size ends before the field), a NULL
// field, or a table too short for the 1.1 functions or missing one of them.
// Any thread; the table lives as long as the backend.
const castmesh_rdma_table_v1* rdma_table(const Backend& backend);
// The same for a raw backend table (what the overload above reads).
const castmesh_rdma_table_v1* rdma_table(const castmesh_backend_v1& table);

// The backend's device memory / stream / collective table (ABI 1.1), or
// nullptr when the backend has none: a table whose struct_size ends before
// the field (1.0, or a 1.1 build that predates it), a NULL field, or a table
// too short for the 1.1 functions or missing one of them. The core drives it
// for device tensors (castmesh/tensor_engine.h) and device collectives
// (docs/collectives.md). Any thread; lives as long as the backend.
const castmesh_tensor_engine_table_v1* tensor_engine_table(const Backend& backend);
// The same for a raw backend table (what the overload above reads).
const castmesh_tensor_engine_table_v1* tensor_engine_table(const castmesh_backend_v1& table);

// Loads the backend named `name_or_path` (a backend name such as "rdma", or a
// path to a library file, which is loaded even if it is in no search folder).
// Errors: NotFound (library missing), FailedPrecondition (ABI mismatch,
// invalid library, duplicate), Unavailable (no driver / no device),
// Internal (init failed). Every message says how to fix it.
absl::StatusOr<const Backend*> load_backend(std::string_view name_or_path);

// Adds a folder (or a library file) to search tier 2 above and forgets the
// cached discovery, so the next backends() call sees it. Backends already
// loaded stay loaded.
void add_backend_search_path(std::string path);

}  // namespace castmesh
