// Where Unix stream sockets live on this system, and who is on the other end.
// Linux has abstract socket names ("unix:@NAME": no file, gone with the
// socket); other systems (and a CASTMESH_POSIX_FALLBACKS build) get socket
// files in a private per-user folder instead ("unix:/PATH"), which the
// endpoint unlinks when it stops listening. The platform choice is made in
// unix_socket_names.cc only. Any thread.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace castmesh::transport {

// True when "unix:@NAME" addresses can be listened on and connected to here.
bool abstract_unix_sockets_supported();

// A fresh Unix listen address for this process, the default of a proc:
// "unix:@castmesh-<pid>-<random>" where abstract names exist, else
// "unix:<folder>/<pid>-<random>" in the folder of private_socket_folder().
// Unavailable when that folder cannot be made.
absl::StatusOr<std::string> unique_unix_listen_address();

// This user's private folder for socket files: "castmesh-<uid>" (mode 0700,
// owned by this user) under $TMPDIR, or under /tmp when $TMPDIR is unset or
// too long for a socket path. Created on first use, when the socket files
// of killed procs ("<pid>-..." of a pid that is gone, where nobody listens)
// are also removed. Refuses (with the reason) a folder of that name that is
// not a private folder of this user.
absl::StatusOr<std::string> private_socket_folder();
// The same, with the candidate parent folders given (first usable wins;
// relative or empty ones are skipped). Not cached.
absl::StatusOr<std::string> private_socket_folder_in(const std::vector<std::string>& bases);

// The pid of the process at the other end of a connected Unix socket, when
// the system tells (Linux SO_PEERCRED, macOS LOCAL_PEERPID).
std::optional<long> unix_peer_pid(int fd);

}  // namespace castmesh::transport
