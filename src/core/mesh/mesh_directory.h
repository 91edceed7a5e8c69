// MeshDirectory: which actor meshes the actors of this process belong to,
// so that a member can find its mesh (its rank, the base shape and every
// peer's address) from inside its own handlers: Communicator::current()
// builds the communicator of a mesh from it. A mesh is listed by the code
// that knows its members in this process: the in-process mesh state when
// all members live here, each proc's cast relay (CastMeshSetup) otherwise.
//
// Process-wide, thread-safe; entries are immutable once added.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "castmesh/address.h"
#include "castmesh/shape.h"

namespace castmesh::mesh {

// One mesh as its members see it. `key` names the mesh uniquely and is
// the same in every proc (owner proc id and mesh number for meshes over
// procs).
struct MeshMembership {
  std::string key;
  std::string name;
  Shape base;                    // row-major ranks 0..n-1
  std::vector<Address> members;  // by base rank
};

class MeshDirectory {
 public:
  // Lists `mesh` under each of its members. Replaces an entry of the same key.
  static void add(std::shared_ptr<const MeshMembership> mesh);
  // Forgets the mesh `key` (members keep communicators already made), then
  // tells every removal observer. Not called when add() replaces an entry.
  static void remove(const std::string& key);
  // Calls `observer(key)` after each remove() from now on, on the remover's
  // thread with no lock held; for per-proc state kept per mesh (the
  // collectives' pinned communicators). Observers live as long as the process.
  static void on_remove(std::function<void(const std::string& key)> observer);
  // The mesh `member` joined most recently that is still listed, or nullptr.
  static std::shared_ptr<const MeshMembership> find(const Address& member);
};

}  // namespace castmesh::mesh
