// Receives a READ_DATA chunk of the socket transport straight into the
// read's destination (transport::PayloadSink): the bytes cross memory once
// on this side, from the kernel into the user's buffer.
//
// Each recv() into the destination happens under the transfer's lock and
// only while it is pending, so a read that failed or timed out receives no
// byte after reporting it: the rest of the chunk goes to scratch memory.
#pragma once

#include <cstdint>
#include <memory>

#include "core/link/transfers.h"
#include "core/transport/endpoint.h"

namespace castmesh::rdma {

using link::Transfer;
using link::Transfers;

// A sink for the chunk of `size` bytes at buffer offset `offset` of `transfer`.
std::shared_ptr<transport::PayloadSink> make_read_sink(std::shared_ptr<Transfer> transfer, uint64_t offset,
                                                       uint64_t size);

}  // namespace castmesh::rdma
