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

// This process's boot id and pid namespace: equal for processes whose pids
// name the same processes.
const std::string& host_identity();
// Whether proc `peer` is on this host as far as its address tells (a Unix
// address, or TCP on a loopback address).
bool proc_on_this_host(const ProcId& peer);
// Copies `size` bytes at `address` in process `pid` into `out`.
// kPermissionDenied / kUnimplemented: the kernel refuses (or not Linux);
// kUnavailable: the process is gone; kInternal: a bad address range.
absl::Status read_process_memory(int64_t pid, uint64_t address, void* out, size_t size);
// Copies `size` bytes from `in` to `address` in process `pid`; errors as above.
absl::Status write_process_memory(int64_t pid, uint64_t address, const void* in, size_t size);

}  // namespace castmesh::platform
