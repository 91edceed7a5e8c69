// Host agent addresses and the mesh secret of agents and their controllers
// (docs/hosts.md). Pure functions of their inputs and of this process's
// environment and files; any thread.
#pragma once

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace castmesh::host {

// Where an agent listens and what it advertises. Plain value.
struct AgentListen {
  std::string listen;          // channel URL, e.g. "tcp:0.0.0.0:26600"
  std::string advertise_host;  // for a wildcard listen host; "" otherwise
};

// Monarch's "tcp://HOST:PORT", castmesh's "tcp:HOST:PORT", and
// "tcp://ADVERTISE@HOST:PORT" -> the agent's listen URL and advertised host
// (a wildcard HOST without "@" advertises default_advertise_host()).
// InvalidArgument for anything else (naming the forms accepted).
absl::StatusOr<AgentListen> parse_agent_address(absl::string_view text);

// The channel URL a controller dials for an agent given as `text` (same
// forms; "ADVERTISE@" is dropped, a wildcard host is refused).
absl::StatusOr<std::string> agent_dial_address(absl::string_view text);

// Environment variable naming a file that holds the mesh secret.
inline constexpr char kEnvSecretFile[] = "CASTMESH_SECRET_FILE";

// The mesh secret: `explicit_secret` if not empty, else $CASTMESH_SECRET,
// else the contents of $CASTMESH_SECRET_FILE (trailing newline dropped),
// which must be a regular file of this user with no group or other
// permissions (mode 0600 or 0400). Errors: none of them set (an agent never
// runs without authentication), an unreadable or world-readable file, an
// empty secret; each says how to fix it.
absl::StatusOr<std::string> resolve_mesh_secret(const std::string& explicit_secret);

}  // namespace castmesh::host
