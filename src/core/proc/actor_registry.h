// Lookup side of the actor registry (registration: castmesh/proc_mesh.h).
#pragma once

#include <optional>
#include <string>

#include "castmesh/proc_mesh.h"

namespace castmesh::proc {

// The factory registered under `name`, if any. Thread-safe.
std::optional<detail::ActorFactory> find_actor_factory(const std::string& name);

}  // namespace castmesh::proc
