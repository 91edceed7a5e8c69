// The RDMA selector: which links carry an operation on an RDMA buffer of
// another proc, in order (link::Transfer::routes). The link layer's cost
// table (link/selector.h, kCostTable) over the paths the owner offers and
// this process can use, with the one-sided table copy (one_sided.h) first
// wherever the owner is on this host and published the buffer's slot. The
// only RDMA code that names paths; buffer operations see link::Link only.
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "castmesh/config.h"
#include "core/link/link.h"
#include "core/link/transfers.h"
#include "core/rdma/handle.h"

namespace castmesh::rdma {

// The links an operation of `length` bytes on `handle` tries, in order
// (`fallback`: the operation's own CASTMESH_RDMA_FALLBACK, if any), or why
// none: kFailedPrecondition when fallback is "error" and ibverbs does not
// reach the owner, or the owner offers nothing this process has; the
// environment's error when a setting there is malformed.
absl::StatusOr<link::Routes> choose_routes(const detail::RdmaHandle& handle, size_t length,
                                                       std::optional<config::RdmaFallback> fallback);

// The route of a RELEASE request (a message to the owner).
link::Routes release_routes();

// What RdmaResult::transport says for an operation `path` carried.
RdmaTransport transport_of(link::Path path);

// Whether the owner's memory is CUDA/ROCm memory (it stages every operation).
bool owner_on_device(const detail::RdmaHandle& handle);

}  // namespace castmesh::rdma
