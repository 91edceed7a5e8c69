// The settings of the data plane and the transport: one table (Config),
// with defaults, read from CASTMESH_* environment variables in one place
// and changeable at run time (configure). docs/config.md lists every
// setting with its default, unit and meaning.
//
// Layers, later ones win: the defaults below, the process's environment
// (read once, at the first use; reload_environment reads it again), and the
// runtime layer (configure). Procs a controller starts afterwards (the
// LocalAllocator's, and HostMesh procs) get the runtime layer in their
// environment, so one configure call in the controller reaches its procs.
// Some settings are read once per process at their first use (docs/config.md
// says which): a later configure changes them for new procs only.
//
// An environment variable that starts with CASTMESH_ and is neither a
// setting nor one of castmesh's other variables (launcher, rendezvous,
// test harness: docs/config.md), or a setting whose value does not parse,
// is an error: check_environment() returns it, and starting a runtime (its
// endpoint), a worker proc or an RDMA operation fails with it.
//
// Threading: every function may be called from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace castmesh::config {

// How a waiter's spin on a shared-memory ring gives up its core.
enum class SpinYield { kAuto, kPause, kYield };
// What an RDMA operation does when ibverbs cannot carry it.
enum class RdmaFallback { kAuto, kError };
// Which reduction kernels run.
enum class ReductionIsa { kAuto, kPortable };

// Every setting, with its default. Plain value.
struct Config {
  // --- collectives (src/core/collectives) ---
  bool shm = true;                                           // CASTMESH_SHM
  absl::Duration shm_spin = absl::Milliseconds(1);           // CASTMESH_SHM_SPIN_US
  std::optional<absl::Duration> shm_spin_oversubscribed;     // CASTMESH_SHM_SPIN_OVERSUBSCRIBED_US; unset: shm_spin
  SpinYield shm_spin_yield = SpinYield::kAuto;               // CASTMESH_SHM_SPIN_YIELD
  bool shm_waiter_sleep = true;                              // CASTMESH_SHM_WAITER_SLEEP
  bool single_copy = true;                                   // CASTMESH_SINGLE_COPY
  bool socket_wait = true;                                   // CASTMESH_SOCKET_WAIT
  bool socket_io_defer = true;                               // CASTMESH_SOCKET_IO_DEFER
  absl::Duration socket_spin = absl::Microseconds(200);      // CASTMESH_SOCKET_SPIN_US
  ReductionIsa reduction_isa = ReductionIsa::kAuto;          // CASTMESH_REDUCTION_ISA
  // --- progress (src/core/progress) ---
  int progress_max_workers = 64;                             // CASTMESH_PROGRESS_MAX_WORKERS
  // --- transport (src/core/transport, src/core/proc) ---
  uint64_t max_message_bytes = uint64_t{1} << 30;            // CASTMESH_MAX_MESSAGE_BYTES
  absl::Duration heartbeat_interval = absl::Milliseconds(500);  // CASTMESH_HEARTBEAT_INTERVAL_MS
  absl::Duration heartbeat_timeout = absl::Seconds(5);          // CASTMESH_HEARTBEAT_TIMEOUT_MS
  // --- RDMA buffers (src/core/rdma) ---
  RdmaFallback rdma_fallback = RdmaFallback::kAuto;          // CASTMESH_RDMA_FALLBACK
  bool rdma_single_copy = true;                              // CASTMESH_RDMA_SINGLE_COPY
  bool rdma_one_sided = true;                                // CASTMESH_RDMA_ONE_SIDED
  bool rdma_shared_segment = true;                           // CASTMESH_RDMA_SHARED_SEGMENT
  uint64_t rdma_chunk_bytes = uint64_t{1} << 20;             // CASTMESH_RDMA_CHUNK_BYTES
  std::string rdma_device;                                   // CASTMESH_RDMA_DEVICE; empty: the first NIC
  uint32_t rdma_port = 0;                                    // CASTMESH_RDMA_PORT; 0: the backend's (1)
  uint32_t rdma_gid_index = 0;                               // CASTMESH_RDMA_GID_INDEX
  // --- observability (src/core/trace) ---
  std::string trace;                                         // CASTMESH_TRACE; empty: no trace
  uint64_t trace_buffer_records = 16384;                     // CASTMESH_TRACE_BUFFER_RECORDS
};

// The kind of a setting's value (how Python shows it).
enum class SettingKind { kBool, kInteger, kChoice, kText };

// One row of the table. Static data.
struct Setting {
  std::string_view key;           // "shm_spin_us": the name configure and Python use
  std::string_view env;           // "CASTMESH_SHM_SPIN_US"
  SettingKind kind;
  std::string_view default_text;  // "1000"; "" where the default depends on another setting
  std::string_view unit;          // "us", "bytes", "ms", "0/1", "auto|error", ...
  std::string_view meaning;       // one sentence
  bool read_once;                 // read at its first use in a process (not per operation)
};

// Every setting, in the order of docs/config.md.
std::span<const Setting> settings();

// The process's settings now (defaults, environment, runtime layer). The
// reference stays valid for the life of the process (an older snapshot after
// a later configure). Where the environment holds an error, the settings it
// names keep their defaults (check_environment() reports it). Cheap: one
// atomic load after the first call.
const Config& global();

// OK, or InvalidArgument naming every unknown CASTMESH_ variable and every
// malformed value of the environment read last.
absl::Status check_environment();

// Reads the environment again (after setenv, e.g. in tests and benchmarks);
// returns check_environment().
absl::Status reload_environment();

// Sets settings in the runtime layer, by key ("shm_spin_us") or variable name
// ("CASTMESH_SHM_SPIN_US"), each value as text ("1"/"0"/"true"/"false" for
// switches). All or nothing: InvalidArgument on an unknown key or a
// malformed value, and then nothing changes.
absl::Status configure(const std::vector<std::pair<std::string, std::string>>& values);

// The runtime layer (key, text), in table order; and replacing it whole
// (what Python's configured() restores on exit; InvalidArgument as configure).
std::vector<std::pair<std::string, std::string>> runtime_config();
absl::Status set_runtime_config(const std::vector<std::pair<std::string, std::string>>& values);
// Empties the runtime layer.
void clear_runtime_config();

// The text of a setting's value in `config` ("" for an unset optional), by
// key; InvalidArgument for an unknown key.
absl::StatusOr<std::string> value_text(const Config& config, std::string_view key);

}  // namespace castmesh::config
