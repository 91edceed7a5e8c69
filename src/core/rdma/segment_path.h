// The shared-segment transport of RDMA buffers: same host, where the kernel
// refuses cross-memory attach (docs/rdma.md). Bytes cross a staging window
// (shared_segment.h) the requester made: the owner copies chunks into its
// slots and the requester copies them out (reads), or the other way round
// (writes), with every slot in flight at once so both copies overlap. A
// SEGMENT_FREE message hands an emptied slot back. Windows are cached per
// owner proc and reused; one whose operation failed is closed, never reused,
// so a late copy by a stopped owner lands in memory nobody reads.
//
// A read's destination is written only by the requester, under the
// transfer's lock and while it is pending (Transfers::deliver).
//
// Thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "castmesh/address.h"
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

// Whether operations towards `owner` may use a shared segment: the switch
// CASTMESH_RDMA_SHARED_SEGMENT is not "0" and `owner` never refused one.
bool shared_segment_reaches(const ProcId& owner);

// Requester side: the process's shared-segment link (leaked: answers may
// arrive during exit). Without a window (no room in /dev/shm), or when the
// owner refuses one, the transfer goes on to its next route (the socket).
link::Link& shared_segment_link();

// Applies a WRITE_DATA chunk's bytes at the owner (the rdma service's
// socket-write bookkeeping); returns the answer to send, if any.
using ApplyWrite = std::function<std::optional<wire::v1::RdmaHeader>(const char* body, size_t size)>;

// Both sides' SEGMENT_* messages from `peer` (I/O thread).
void on_segment_message(const std::weak_ptr<proc::ProcHost>& weak, proc::ProcHost& host, const ProcId& peer,
                        const wire::v1::RdmaHeader& header, const ApplyWrite& apply);

// Proc `peer` is gone: its windows and copies end.
void segment_peer_lost(const ProcId& peer);

}  // namespace castmesh::rdma
