// One-sided same-host copies of RDMA buffers: the requester copies straight
// out of (or into) the owner's memory with process_vm_readv/writev, without
// a message to the owner, as a NIC's RDMA READ/WRITE would (docs/rdma.md,
// "One-sided same-host copies").
//
// The owner publishes a registration table to each same-host requester proc
// that asks for it (TABLE_OPEN -> TABLE, once per pair of procs): a POSIX
// shared-memory object (shared_segment.h) with one entry per registered
// buffer: a state word (generation, releasing bit, in-flight count) and the
// buffer's address, size and access. A handle names its buffer's slot and
// generation. The requester enters a slot (compare-and-swap: the generation
// matches and the slot is not releasing, then in-flight + 1), checks the
// range and access against the entry, copies, and leaves (in-flight - 1).
// release() sets the releasing bit in every table and keeps the
// registration, and so the memory, until every table's in-flight count of
// the slot is 0; the tables of requester procs that were lost are no longer
// counted, so a dead requester cannot keep the memory forever. A table per
// requester keeps one requester's counts apart from another's.
//
// Every value read from the table is checked (slot number, generation, size,
// access, address); a bad one is a clear error, never an access outside the
// table or outside the registered range. Where the table or cross-memory
// attach is unavailable the operation takes the request/answer transports.
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "castmesh/address.h"
#include "castmesh/rdma.h"
#include "core/rdma/registry.h"
#include "core/link/link.h"
#include "core/link/transfers.h"

namespace castmesh::wire::v1 {
class RdmaHeader;
}

namespace castmesh::proc {
class ProcHost;
}

namespace castmesh::rdma {

using link::Transfer;
using link::Transfers;

// Entries per table (a table is 64 KiB: a 64-byte header and 64-byte entries).
inline constexpr uint32_t kOneSidedSlots = 1023;

// A buffer's place in its owner's tables; generation 0: it has none.
struct OneSidedRef {
  uint32_t slot = 0;
  uint64_t generation = 0;
};

// Whether this process may copy one-sided: a Linux build, cross-memory attach
// not refused so far, and neither CASTMESH_RDMA_ONE_SIDED nor
// CASTMESH_RDMA_SINGLE_COPY is "0".
bool one_sided_enabled();

// Owner side: gives `registration` a slot in every table (present and
// future). A generation of 0 when all slots are taken.
OneSidedRef one_sided_publish(const Registration& registration);
// Owner side: `registration` was released. New one-sided copies of it fail
// at once; it is kept (with its memory) until no table counts a copy in flight.
void one_sided_retire(std::shared_ptr<const Registration> registration);
// Owner side: TABLE_OPEN from `peer`: makes its table and answers TABLE.
void one_sided_on_table_open(proc::ProcHost& host, const ProcId& peer, const wire::v1::RdmaHeader& header);

// Requester side: TABLE from `owner`: maps the table and starts what waited for it.
void one_sided_on_table(proc::ProcHost& host, const ProcId& owner, const wire::v1::RdmaHeader& header);
// Requester side: the process's link of one-sided copies (the first route
// of a same-host operation whose handle has a slot): start_now() copies at
// once while the owner's table is mapped here (below 4 MiB); start() opens
// the table first when needed and hands the transfer on (link::start_next)
// where a one-sided copy is not possible.
link::Link& table_link();

// Proc `peer` is gone: as an owner, its tables no longer count; as a
// requester, the owner's table is dropped.
void one_sided_peer_lost(const ProcId& peer);

}  // namespace castmesh::rdma
