// The single-copy link of RDMA buffers (same host, operations of
// kSingleCopyMinBytes and more): the requester asks the owner for a LEASE on
// the range; the owner pins its registration and answers LEASE_GRANTED with
// the range's address and its pid; the requester copies with
// process_vm_readv/writev (link/single_copy.h) under the transfer's lock and
// ends the lease (LEASE_END). Where the kernel refuses the copy, the
// transfer goes on to its next route (link::start_next).
//
// Thread-safe.
#pragma once

#include <memory>

#include "castmesh/address.h"
#include "core/link/link.h"

namespace castmesh::wire::v1 {
class RdmaHeader;
}

namespace castmesh::proc {
class ProcHost;
}

namespace castmesh::rdma {

// The process's single-copy link (leaked: answers may arrive during exit).
link::Link& lease_link();

// Owner side: LEASE from `peer` (I/O thread).
void on_lease(proc::ProcHost& host, const ProcId& peer, const wire::v1::RdmaHeader& header);
// Requester side: LEASE_GRANTED from `peer` (I/O thread).
void on_lease_granted(const std::weak_ptr<proc::ProcHost>& weak, proc::ProcHost& host, const ProcId& peer,
                      const wire::v1::RdmaHeader& header);

}  // namespace castmesh::rdma
