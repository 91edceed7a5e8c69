// Single copy between processes of one host: process_vm_readv/writev
// (Linux cross-memory attach) read or write a peer process's memory
// directly, so a large message crosses memory once instead of through a
// socket (a copy into the frame, two kernel copies, a copy out). The one
// implementation under collectives' single-copy offers
// (single_copy_link.h) and RDMA buffers' one-sided copies (rdma/).
//
// Possible only on Linux, between processes that see each other's pids
// (same boot, same pid namespace: platform::host_identity() agrees) and may
// ptrace each other (same user; Yama, seccomp and some container runtimes
// refuse it). The first refusal is remembered process-wide: both users stop
// trying and one log line says so. CASTMESH_SINGLE_COPY=0 turns collectives'
// offers off, CASTMESH_RDMA_SINGLE_COPY=0 RDMA's.
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "castmesh/address.h"

namespace castmesh::link {

// Messages and RDMA operations of at least this many bytes to another
// process of this host go by single copy; smaller ones are cheaper as one
// message (the selector's cost table, selector.h, says why).
inline constexpr size_t kSingleCopyMinBytes = 64 * 1024;

// False once the kernel refused a cross-memory copy in this process.
bool single_copy_usable();
// The kernel refused a cross-memory copy (`why`): logs once;
// single_copy_usable() is false from now on.
void note_single_copy_refused(const absl::Status& why);
// Whether collectives send single-copy offers at all: Linux, the switch
// (CASTMESH_SINGLE_COPY) on, and the kernel has not refused.
bool single_copy_enabled();
// Whether collectives send single-copy offers to `peer`: Linux, the switch
// on, the kernel has not refused, and `peer` is on this host (a Unix
// address, or TCP on a loopback address; the receiver checks the host
// identity the offer carries and falls back when it differs).
bool single_copy_towards(const ProcId& peer);
// Reads `size` bytes at `address` in process `pid` into `out`, counting
// them (single_copy_bytes). kPermissionDenied / kUnimplemented when the
// kernel refuses (noted: single_copy_usable() turns false); kUnavailable
// when the process is gone.
absl::Status read_process_memory(int64_t pid, uint64_t address, void* out, size_t size);
// Copies `length` bytes between `local` and `address` in process `pid`
// (`write`: local -> remote), large ones as two halves on two threads (the
// kernel pins each page first, so one core copies well below memcpy). The
// caller notes a refusal.
absl::Status copy_between(int64_t pid, uint64_t address, char* local, size_t length, bool write);
// Bytes read by read_process_memory so far (this process).
uint64_t single_copy_bytes();

}  // namespace castmesh::link
