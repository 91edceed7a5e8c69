// The ibverbs transport of RDMA buffers: one-sided RDMA READ/WRITE through
// the "rdma" backend's castmesh_rdma_table_v1 (docs/rdma.md).
//
// Process-wide. On first use it loads the backend and opens a NIC
// (CASTMESH_RDMA_DEVICE, CASTMESH_RDMA_PORT, CASTMESH_RDMA_GID_INDEX; default:
// the first active port, GID index 0); when a step fails it remembers why in
// one sentence and every operation uses the other transports.
//
// Owner side: register_range() registers a buffer with the NIC (the handle
// then carries its address and rkey); the NIC registration is dropped with
// the core's Registration. Requester side: one RC endpoint per peer proc
// this process reads or writes, connected lazily over the rdma service's
// CONNECT / CONNECTED messages (operations queue meanwhile); the peer's side
// of it is created when its CONNECT arrives. Reads land in a registered
// bounce region and are copied into the destination under the transfer's
// lock (Transfers::deliver), so a NIC that finishes after a timeout never
// writes the destination. One poller thread per process completes
// operations by wr_id.
//
// Thread-safe.
#pragma once

#include <memory>
#include <string>

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

// A NIC registration of an owner's buffer.
struct NicRange {
  std::shared_ptr<void> registration;  // deregisters when the last copy goes
  uint32_t rkey = 0;
};

class IbverbsPath {
 public:
  // The process's path (leaked: the poller and I/O threads may use it during exit).
  static IbverbsPath& instance();

  // Whether this process has a NIC open (opens it on first call).
  bool usable();
  // Why usable() is false, one sentence ("" while usable).
  std::string why_not();
  // False once a connection to `peer` failed: operations to it use the fallbacks.
  bool reachable(const ProcId& peer);
  // Why `peer` is not reachable ("" when it is).
  std::string why_unreachable(const ProcId& peer);

  // Owner side: registers [base, base+size) for remote `access`.
  absl::StatusOr<NicRange> register_range(void* base, size_t size, RdmaAccess access);

  // Requester side: starts `transfer` (transport kIbverbs, remote_address and
  // rkey set, already tracked by Transfers); completes it through Transfers.
  void start(const std::shared_ptr<Transfer>& transfer);

  // The rdma service's CONNECT (owner side) and CONNECTED (requester side).
  void on_connect(proc::ProcHost& host, const ProcId& peer, const wire::v1::RdmaHeader& header);
  void on_connected(const ProcId& peer, const wire::v1::RdmaHeader& header);
  // Proc `peer` is gone: destroys the endpoints to it (Transfers fails its
  // operations) and stops waiting for its DRAINED.
  void peer_lost(const ProcId& peer);

  // Owner side: `registration` was just released (nullptr: it was not
  // live). Its NIC registration, and so its memory, stays until every peer
  // connected to this process answered RELEASING with DRAINED (or was
  // lost): one-sided operations already posted finish. `host` (may be null:
  // no peer to ask) sends RELEASING.
  void retire(std::shared_ptr<const Registration> registration, proc::ProcHost* host);
  // Requester side: the owner released a buffer. Operations on it that start
  // later fail before posting; DRAINED goes back once none is in flight.
  void on_releasing(proc::ProcHost& host, const ProcId& peer, const wire::v1::RdmaHeader& header);
  // Owner side: `peer` has no work request left on the buffer.
  void on_drained(const ProcId& peer, const wire::v1::RdmaHeader& header);

  struct State;

 private:
  IbverbsPath();
  State* state_;
};

// The process's ibverbs link: start() posts the transfer through
// IbverbsPath (leaked, as the path).
link::Link& ibverbs_link();

}  // namespace castmesh::rdma
