// The harness of the collectives tests: run one scenario (a function of the
// member's Communicator) on every member of a fresh in-process ActorMesh and
// collect what each rank did. One copy for the host and device collective
// tests; V is the element type of the values a scenario reports.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "castmesh/actor_mesh.h"
#include "castmesh/communicator.h"

namespace castmesh::testing {

// What a member did: an error (empty if none), or the values it ended with.
template <typename V>
struct ScenarioOutcome {
  std::string error;
  std::vector<V> values;
};

// Runs inside a member's handler with its communicator.
template <typename V>
using ScenarioFn = std::function<ScenarioOutcome<V>(Communicator&)>;

// The outcome of a scenario that stopped at `status`.
template <typename V>
ScenarioOutcome<V> scenario_error(const absl::Status& status) {
  return ScenarioOutcome<V>{status.ToString(), {}};
}

// The message a member runs.
template <typename V>
struct RunScenario {
  ScenarioFn<V> scenario;
};

// A mesh member that runs scenarios with Communicator::current().
template <typename V>
class ScenarioMember : public Actor {
 public:
  ScenarioOutcome<V> run(const RunScenario<V>& m) {
    absl::StatusOr<Communicator> comm = Communicator::current();
    if (!comm.ok()) return scenario_error<V>(comm.status());
    return m.scenario(*comm);
  }
  using Handlers = castmesh::Handlers<&ScenarioMember::run>;
};

// Spawns the meshes on one runtime. Members block in collectives on pooled
// workers, so give the runtime more workers than the largest mesh (the
// mesh's forwarders must always find one free: docs/collectives.md,
// "Progress and threads"). Test thread only.
template <typename V>
class ScenarioMeshes {
 public:
  ScenarioMeshes(std::string name, int workers) : runtime_(RuntimeOptions{.workers = workers}), name_(std::move(name)) {}

  // One outcome per rank of `shape` (row-major); empty if the mesh failed
  // (the failure is a test failure already).
  std::vector<ScenarioOutcome<V>> run_on(const Shape& shape, ScenarioFn<V> scenario) {
    auto mesh = ActorMesh<ScenarioMember<V>>::Spawn(runtime_, shape,
                                                    MeshOptions{.name = name_ + std::to_string(meshes_++)});
    EXPECT_TRUE(mesh.ok()) << mesh.status();
    if (!mesh.ok()) return {};
    auto values = mesh->call(RunScenario<V>{std::move(scenario)}).get(absl::Seconds(60));
    EXPECT_TRUE(values.ok()) << values.status();
    mesh->stop();
    return values.ok() ? values->values() : std::vector<ScenarioOutcome<V>>{};
  }
  // The same over a 1-D mesh of `n` ranks.
  std::vector<ScenarioOutcome<V>> run(int n, ScenarioFn<V> scenario) {
    return run_on(*Shape::Create({{"ranks", static_cast<size_t>(n)}}), std::move(scenario));
  }
  Runtime& runtime() { return runtime_; }

 private:
  Runtime runtime_;
  std::string name_;
  int meshes_ = 0;  // each run spawns a fresh mesh (stop() is asynchronous)
};

// The fixture of the suites that run scenarios on in-process meshes: a
// fresh mesh per run, on one runtime of `workers` workers (more than the
// largest mesh: members block in collectives).
template <typename V>
class ScenarioMeshTest : public ::testing::Test {
 protected:
  ScenarioMeshTest(std::string name, int workers) : meshes_(std::move(name), workers) {}

  // One outcome per rank of `shape`; empty if the mesh failed.
  std::vector<ScenarioOutcome<V>> run_on(const Shape& shape, ScenarioFn<V> scenario) {
    return meshes_.run_on(shape, std::move(scenario));
  }
  // The same over a 1-D mesh of `n` ranks.
  std::vector<ScenarioOutcome<V>> run(int n, ScenarioFn<V> scenario) { return meshes_.run(n, std::move(scenario)); }

  ScenarioMeshes<V> meshes_;
};

}  // namespace castmesh::testing
