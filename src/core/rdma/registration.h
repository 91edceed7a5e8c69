// An RDMA buffer's registration with every path that needs one: the
// registry entry (registry.h), the NIC range where this process has a NIC
// (ibverbs_path.h) and the slot in the one-sided tables (one_sided.h); and
// the paths' part of a release. The paths' side of RdmaBuffer::register_memory
// and release, so that the buffer operations name no path.
//
// Thread-safe.
#pragma once

#include <memory>
#include <vector>

#include "castmesh/address.h"
#include "castmesh/rdma.h"
#include "core/rdma/one_sided.h"
#include "core/rdma/registry.h"

namespace castmesh::proc {
class ProcHost;
}

namespace castmesh::rdma {

// What a registration gives the buffer's handle.
struct Registered {
  std::shared_ptr<const Registration> registration;
  std::vector<RdmaTransport> transports;  // what the handle offers, in order
  OneSidedRef table;                      // generation 0: no slot (device memory, or the tables are full)
};

// Registers `view` (checked; `device`: CUDA/ROCm memory) for `owner`. A NIC
// that refuses the range is logged and the buffer offered over the others.
Registered register_with_paths(const TensorView& view, RdmaAccess access, const ProcId& owner, bool device);

// `released` (just taken out of the registry; nullptr: it was not live)
// leaves the paths: new one-sided copies of it fail, NIC peers are asked to
// drain (through `host`, may be null). Call when_freed() next.
void retire_from_paths(const std::shared_ptr<const Registration>& released, proc::ProcHost* host);

}  // namespace castmesh::rdma
