// The "rdma" proc service: the wire protocol of RDMA buffers between procs
// (proto/castmesh/wire/v1/rdma.proto), both sides of it.
//
// Owner side: answers READ with the bytes as READ_DATA chunks sent straight
// from the registered memory, applies WRITE_DATA chunks, grants and ends
// LEASEs for same-host single copies (lease_link.h), and releases buffers.
// Requester side: feeds the answers to link::Transfers; the first message
// of each operation is its link's (socket_link.h, lease_link.h, ...). Chunks of one operation are all sent at
// once (the connection's queue paces them); operations of 256 KiB or more
// are sent from their own thread so that neither an I/O thread nor the
// caller waits for the queue.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "castmesh/wire/v1/rdma.pb.h"
#include "core/link/transfers.h"
#include "core/wire/payload.h"

namespace castmesh::rdma {

using link::Transfer;
using link::Transfers;

// The data message type of the service.
inline constexpr char kRdmaDataType[] = "castmesh.rdma.v1";

// A message header of `kind` about operation `op`.
wire::v1::RdmaHeader header_of(wire::v1::RdmaHeader::Kind kind, uint64_t op);
// A header of `kind` (FAILED, or a path's own refusal) about `op` carrying
// `why`'s code and message, which the requester turns back into a status.
wire::v1::RdmaHeader failure_header(uint64_t op, const absl::Status& why,
                                    wire::v1::RdmaHeader::Kind kind = wire::v1::RdmaHeader::FAILED);
// Sends failure_header(op, why, kind) to `peer` (a lost peer needs no answer).
void send_failure(proc::ProcHost& host, const ProcId& peer, uint64_t op, const absl::Status& why,
                  wire::v1::RdmaHeader::Kind kind = wire::v1::RdmaHeader::FAILED);

// Sends `header` (and `body`) to `peer` over the procs' connection. Any thread.
absl::Status send_message(proc::ProcHost& host, const ProcId& peer, const wire::v1::RdmaHeader& header,
                          wire::Payload body = {});

// Bytes per READ_DATA / WRITE_DATA message: CASTMESH_RDMA_CHUNK_BYTES, else 1 MiB.
size_t chunk_bytes();

// Runs `job` now when `bytes` is small, else on a thread of its own (it may
// wait for a full connection queue or copy for long, which an I/O thread
// and a caller must not).
void run_job(size_t bytes, std::function<void()> job);

}  // namespace castmesh::rdma
