// The harness of the tests that run across real worker procs (this binary
// re-executed, see worker_procs_main.cc): start n procs (with environment
// variables they inherit), run a named scenario as one rank of a mesh of
// ProcScenarioMember (one per proc) and collect each rank's reply, or let one
// rank's proc die and check what the survivors answered. One copy for the
// collectives, shared-memory path, device and RDMA tests that start procs.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "castmesh/actor_mesh.h"
#include "castmesh/communicator.h"
#include "castmesh/proc_mesh.h"

namespace castmesh::testing {

// A scenario one rank runs in its worker proc: it fails, or fills `out`
// (what follows "OK " in its reply).
using ProcScenarioFn = std::function<absl::Status(Communicator&, std::string& out)>;
// The same, reporting numbers (joined with "," in the reply).
using ProcScenarioNumbersFn = absl::Status (*)(Communicator&, std::vector<double>& got);

// Registers scenarios under names, at static initialisation (so every proc
// of the binary has them): `const bool registered = register_proc_scenarios({...});`.
bool register_proc_scenarios(std::vector<std::pair<std::string, ProcScenarioFn>> scenarios);
// Adapts a scenario that reports numbers.
ProcScenarioFn joined(ProcScenarioNumbersFn fn);

// The message a member runs: the name of a registered scenario.
struct RunProcScenario {
  std::string name;
};

// A mesh member that runs scenarios with Communicator::current() and answers
// "OK" (then " <out>" when out is not empty) or "ERR <status>".
class ProcScenarioMember : public Actor {
 public:
  std::string run(const RunProcScenario& m);
  using Handlers = castmesh::Handlers<&ProcScenarioMember::run>;
};

// How the procs start.
struct WorkerProcsOptions {
  // Set while the procs start (they inherit them), then restored.
  std::vector<std::pair<std::string, std::string>> env = {};
  // The member mesh keeps going when a member's proc dies.
  bool continue_on_failure = false;
  // The procs' transport (LocalAllocatorOptions::transport): "unix", or
  // "tcp" (real TCP over IPv4 loopback, as between hosts).
  std::string transport = "unix";
};

// n worker procs, stopped at the end (a failure to start is a test failure
// already; ok() says whether they run). Test thread only.
class WorkerProcs {
 public:
  explicit WorkerProcs(int n, WorkerProcsOptions options = {});
  ~WorkerProcs();
  WorkerProcs(const WorkerProcs&) = delete;
  WorkerProcs& operator=(const WorkerProcs&) = delete;

  // Whether the procs started.
  bool ok() const { return procs_.has_value(); }
  // The procs (only when ok()).
  ProcMesh& procs() { return *procs_; }
  // The runtime of this (the controller's) process.
  Runtime& runtime() { return runtime_; }

  // Each rank's reply to `scenario` (a ProcScenarioMember per proc), rank
  // order; empty when the call failed (a test failure already).
  std::vector<std::string> run(const std::string& scenario, absl::Duration timeout);
  // Runs `scenario`, in which rank `dead`'s proc dies: its reply must fail;
  // every survivor's reply must come within `per_reply` and is passed to
  // `check_survivor` (rank, reply). Returns how many survivors answered.
  int run_with_dead_rank(const std::string& scenario, int dead, absl::Duration per_reply,
                         const std::function<void(int rank, const std::string& reply)>& check_survivor);
  // Stops the procs (once; the destructor does it otherwise).
  absl::Status stop();

 private:
  // The member mesh, spawned on first use.
  ActorMesh<ProcScenarioMember>* members();

  const bool continue_on_failure_;
  Runtime runtime_;
  std::optional<ProcMesh> procs_;
  std::optional<ActorMesh<ProcScenarioMember>> members_;
  bool stopped_ = false;
};

// Starts n procs, runs `scenario` on them, stops them (expecting a clean
// stop): each rank's reply, or empty when that failed.
std::vector<std::string> run_on_worker_procs(int n, const std::string& scenario, absl::Duration timeout,
                                             WorkerProcsOptions options = {});

// Expects `reply` to be an error that names `what`.
void expect_error_naming(const std::string& reply, const std::string& what, int rank);

}  // namespace castmesh::testing
