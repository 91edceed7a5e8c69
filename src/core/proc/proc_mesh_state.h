// The shared state behind ProcMesh and its slices, made by an allocator
// once every proc has joined. Private to the core.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/proc_mesh.h"
#include "core/proc/proc_host.h"

namespace castmesh::detail {

class SpawnLedger;
struct Departures;

// Shared by the copies of one ProcMesh; destroyed on the thread that drops
// the last copy. Thread-safe.
//
// Who ends the procs: a mesh `owns_processes` when this process started
// them (LocalAllocator: its children): stop() sends Stop, waits up to 5 s
// and SIGKILLs and reaps the rest. Procs started by a launcher
// (RendezvousAllocator) are not our children: stop() sends Stop and waits
// up to 5 s for their connections to close; one still connected then is
// reported (DeadlineExceeded) and left to its launcher, since there is no
// process here to kill.
class ProcMeshState {
 public:
  // A mesh of `procs` (by rank) on `host`: names each proc to the host for
  // error messages and starts tracking deaths (supervision events for the
  // actors spawned there, departures for stop()).
  static std::shared_ptr<ProcMeshState> create(std::shared_ptr<proc::ProcHost> host, std::string secret,
                                               std::vector<ProcInfo> procs, bool owns_processes);
  ~ProcMeshState();

  const std::shared_ptr<proc::ProcHost>& host() const { return host_; }
  const std::vector<ProcInfo>& procs() const { return procs_; }
  const std::string& secret() const { return secret_; }
  const std::shared_ptr<SpawnLedger>& ledger() const { return ledger_; }

  // Procs already gone when the mesh was made (JoinBoard::lost_procs).
  void mark_gone(const std::vector<ProcId>& procs);

  // For procs that are not this process's children but that someone can
  // still end (a host agent): stop() calls it with the procs that did not
  // exit within the grace period. Set once, before the mesh is shared.
  using StragglerKiller = std::function<absl::Status(const std::vector<ProcInfo>& stragglers)>;
  void set_straggler_killer(StragglerKiller killer) { straggler_killer_ = std::move(killer); }

  // See the type comment. Idempotent.
  absl::Status stop();

  // Waits up to `grace` for the child processes `pids` to exit, then
  // SIGKILLs and reaps the rest. Returns how many had to be killed.
  static int reap(std::vector<pid_t> pids, std::chrono::milliseconds grace);

 private:
  ProcMeshState() = default;
  // Procs not started here: waits up to `grace` for their departure after
  // Stop; returns those still there.
  std::vector<ProcInfo> await_departures(std::chrono::milliseconds grace);

  std::shared_ptr<proc::ProcHost> host_;
  std::vector<ProcInfo> procs_;
  std::string secret_;
  bool owns_processes_ = true;
  StragglerKiller straggler_killer_;
  std::shared_ptr<SpawnLedger> ledger_;
  std::shared_ptr<Departures> departures_;
  uint64_t observer_id_ = 0;            // peer-lost observer of the ledger
  uint64_t failure_observer_id_ = 0;    // remote-failure observer of the ledger
  uint64_t departure_observer_id_ = 0;  // peer-lost observer of departures_
  detail::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

// The shape of a mesh allocated for `requested`: its labels and sizes,
// numbered 0..n-1 row-major whatever view `requested` was.
absl::StatusOr<Shape> mesh_shape(const Shape& requested);
// One dimension "procs" of `procs` (> 0) procs.
absl::StatusOr<Shape> line_shape(int procs);

// Makes a ProcMesh over `state` with `shape` (row-major ranks 0..n-1).
ProcMesh make_proc_mesh(std::shared_ptr<ProcMeshState> state, Shape shape);

}  // namespace castmesh::detail
