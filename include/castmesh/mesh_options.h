// How an actor mesh is spawned and supervised: MeshOptions (its members'
// name, its cast tree's fan-out, its failure policy) and MeshEvent (a member
// stopped). Plain values; included by castmesh/actor_mesh.h, which
// describes the supervision rules (docs/meshes.md).
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "castmesh/address.h"
#include "castmesh/shape.h"

namespace castmesh {

// A member of a mesh stopped. `point` is its point in the mesh as spawned.
struct MeshEvent {
  std::string mesh;      // the mesh's name
  Point point;
  Address actor;
  absl::Status reason;   // non-OK: it failed; OK: it was stopped normally

  // "mesh 'worker' member {hosts=1, gpus=2} (local/worker[6]) failed: ..."
  std::string to_string() const;
};

// What a mesh does after one of its members failed.
enum class MeshFailureAction {
  kStop,      // stop every member; later requests fail naming the failure
  kContinue,  // keep the survivors; requests that include dead points fail
};

// Decides what to do about a failed member. Runs on the thread where the
// member stopped; must not block.
using MeshFailureHandler = std::function<MeshFailureAction(const MeshEvent&)>;

// How ActorMesh::Spawn names a mesh's members, shapes its cast tree and
// handles a member's failure. A plain value; copy it freely.
struct MeshOptions {
  // Name of the member actors (their addresses are proc/name[rank]); the
  // in-process forwarding actors (a mesh whose members are all in this
  // process) are named name + "-cast". Default: the class name.
  std::string name{};
  // Fan-out of the cast tree (over members in process, over procs across
  // procs); a value >= the number of nodes is direct fan-out.
  size_t fanout = 8;
  // Default (empty): log the event and stop the mesh.
  MeshFailureHandler on_failure = nullptr;
};

}  // namespace castmesh
