// Single-copy transfers between processes of one host: the receiver reads
// the sender's buffer straight into its own with process_vm_readv (Linux
// cross-memory attach), so a large message crosses memory once instead of
// through a socket (a copy into the frame, two kernel copies, a copy out).
//
// Possible only on Linux, between processes that see each other's pids
// (same boot, same pid namespace) and may ptrace each other (same user;
// Yama, seccomp and some container runtimes refuse it). The receiver tries;
// when the kernel refuses, the sender is told and sends the bytes over the
// transport instead, and this process stops trying (one log line says so).
// CASTMESH_SINGLE_COPY=0 turns the path off.
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "castmesh/address.h"

namespace castmesh::collectives {

// Messages of at least this many bytes to another process on this host go
// by single copy (smaller ones are cheaper as one frame).
inline constexpr size_t kSingleCopyMinBytes = 64 * 1024;

// Whether this process sends single-copy offers to `peer`: enabled, the
// kernel has not refused, and `peer` is on this host (a Unix address, or
// TCP on a loopback address).
bool single_copy_towards(const ProcId& peer);
// Reads `size` bytes at `address` in process `pid` into `out`
// (platform::read_process_memory, core/platform/process_memory.h).
// kPermissionDenied / kUnimplemented when the kernel refuses (the caller
// falls back and this process stops offering); kUnavailable when the
// process is gone.
absl::Status read_process_memory(int64_t pid, uint64_t address, void* out, size_t size);
// Bytes read so far by read_process_memory (this process, any thread).
uint64_t single_copy_bytes();

}  // namespace castmesh::collectives
