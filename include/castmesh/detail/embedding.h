// Internal: what a program embedding castmesh as a controller needs beyond
// the public API (the Python extension, python/src; the benchmarks). Not
// user API: it may change with the proc layer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "castmesh/runtime.h"

namespace castmesh::detail {

// A runtime's identity as a proc of a mesh. Holding it keeps the runtime a
// proc (its transport endpoint listening); plain value, any thread.
struct ProcIdentity {
  std::shared_ptr<void> hold;  // the proc's host; the runtime stops being a proc once the last holder lets go
  std::string id;              // the proc's id: its address
  std::string secret;          // the mesh secret peers must prove
};

// Makes `runtime` a proc on a fresh private address (abstract Unix socket)
// with a fresh mesh secret. Fails if it is one already. Any thread.
absl::StatusOr<ProcIdentity> attach_proc(Runtime& runtime);

// The proc `runtime` is (made by attach_proc or RendezvousAllocator::listen),
// or nullopt when it is none. Any thread.
std::optional<ProcIdentity> proc_identity(const Runtime& runtime);

// Messages the proc of `runtime` has sent to other procs (0 when it is no
// proc); for benchmarks that count the messages a cast costs. Any thread.
uint64_t proc_messages_sent(const Runtime& runtime);

// Overwrites the variable's value in the process's environment block and
// unsets it (for secrets; see platform::erase_from_environment). Main
// thread, before other threads read the environment.
void erase_from_environment(const char* name);

}  // namespace castmesh::detail
