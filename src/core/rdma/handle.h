// What an RdmaBuffer handle knows of its buffer (RdmaHandle on the wire),
// and the link::Region an operation on it carries.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "castmesh/address.h"
#include "castmesh/rdma.h"
#include "core/link/link.h"
#include "core/rdma/one_sided.h"

namespace castmesh::detail {

struct RdmaHandle {
  uint64_t id = 0;
  ProcId owner;
  size_t size = 0;
  RdmaAccess access = RdmaAccess::kReadWrite;
  int64_t pid = 0;
  std::string host_identity;
  std::vector<RdmaTransport> transports;
  uint64_t nic_address = 0;  // ibverbs: 0 when the owner registered no NIC range
  uint32_t rkey = 0;
  rdma::OneSidedRef one_sided;  // same-host one-sided copies (generation 0: none)
  Device device;                // the owner's memory: CUDA/ROCm memory is staged by the owner
  // The fields above as the links read them (rdma::region_of), made once
  // with the handle so that an operation copies nothing to reach a link.
  link::Region region;
};

}  // namespace castmesh::detail

namespace castmesh::rdma {

// Whether the owner offers `transport` for the buffer.
inline bool offers(const detail::RdmaHandle& handle, RdmaTransport transport) {
  return std::find(handle.transports.begin(), handle.transports.end(), transport) != handle.transports.end();
}

// The buffer as a link::Region: what every link reads to reach it.
inline link::Region region_of(const detail::RdmaHandle& handle) {
  link::Region region;
  region.pid = handle.pid;
  region.host_identity = handle.host_identity;
  region.bytes = handle.size;
  region.owner = handle.owner;
  region.id = handle.id;
  region.nic_address = handle.nic_address;
  region.rkey = handle.rkey;
  region.table_slot = handle.one_sided.slot;
  region.table_generation = handle.one_sided.generation;
  return region;
}

}  // namespace castmesh::rdma
