// Cross-memory attach: copying straight between this process's memory and
// another process's (Linux process_vm_readv / process_vm_writev), so bytes
// between processes of one host cross memory once instead of through a
// socket. Used by the collectives' single-copy path and RDMA buffers.
//
// Possible only on Linux, between processes that see each other's pids
// (same boot, same pid namespace: compare host_identity()) and may ptrace
// each other (same user; Yama ptrace_scope, seccomp and some container
// runtimes refuse it). Callers try, and fall back to their transport on
// kPermissionDenied / kUnimplemented.
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "castmesh/address.h"

namespace castmesh::platform {

// Environment variable that sets host_identity() (a host agent gives its
// procs its own; docs/hosts.md).
inline constexpr char kEnvHostIdentity[] = "CASTMESH_HOST_IDENTITY";
// The one identity every same-host decision compares (shared memory, single
// copy, pid-based paths): $CASTMESH_HOST_IDENTITY when set, else this
// process's boot id, pid namespace and network namespace. Two network
// namespaces (or containers) on one machine share the boot id, the pid
// namespace and /dev/shm, yet are separate hosts to castmesh; equal
// identities mean the processes' pids name the same processes.
const std::string& host_identity();
// The identity computed from this process's namespaces, ignoring
// $CASTMESH_HOST_IDENTITY (what a host agent defaults to).
std::string namespace_host_identity();
// Whether proc `peer` is on this host as far as its address tells: a Unix
// address, TCP on a loopback address, or TCP at this proc's own TCP host
// (note_this_proc_address; the same address reaches the same network
// namespace).
bool proc_on_this_host(const ProcId& peer);
// Tells proc_on_this_host this process's own proc address (ProcHost::attach).
void note_this_proc_address(const ProcId& self);
// Copies `size` bytes at `address` in process `pid` into `out`.
// kPermissionDenied / kUnimplemented: the kernel refuses (or not Linux);
// kUnavailable: the process is gone; kInternal: a bad address range.
absl::Status read_process_memory(int64_t pid, uint64_t address, void* out, size_t size);
// Copies `size` bytes from `in` to `address` in process `pid`; errors as above.
absl::Status write_process_memory(int64_t pid, uint64_t address, const void* in, size_t size);

}  // namespace castmesh::platform
