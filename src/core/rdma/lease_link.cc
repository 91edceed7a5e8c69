#include "core/rdma/lease_link.h"

#include <unistd.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "castmesh/wire/v1/rdma.pb.h"
#include "core/link/single_copy.h"
#include "core/link/transfers.h"
#include "core/proc/proc_host.h"
#include "core/rdma/device_staging.h"
#include "core/rdma/registry.h"
#include "core/rdma/service.h"

namespace castmesh::rdma {
namespace {

namespace v1 = wire::v1;

class LeaseLink final : public link::Link {
 public:
  link::Path path(const ProcId&) const override { return link::Path::kSingleCopy; }
  link::Capabilities capabilities() const override {
    link::Capabilities caps;
    caps.zero_copy = true;  // the owner's thread only grants; the bytes cross memory once
    return caps;
  }
  void start(const std::shared_ptr<link::Transfer>& transfer) override {
    // The kernel may have refused cross-memory copies since the route was chosen.
    if (!link::single_copy_usable()) return link::start_next(transfer);
    std::shared_ptr<proc::ProcHost> host = transfer->host.lock();
    if (host == nullptr) {
      return Transfers::instance().finish(transfer, absl::UnavailableError("this proc's transport is shut down"));
    }
    transfer->transport = RdmaTransport::kSingleCopy;  // nothing else reads it before the first message goes
    v1::RdmaHeader lease = header_of(v1::RdmaHeader::LEASE, transfer->id);
    lease.set_buffer(transfer->remote.id);
    lease.set_write(transfer->write);
    lease.set_offset(transfer->offset);
    lease.set_length(transfer->length);
    if (absl::Status sent = send_message(*host, transfer->remote.owner, lease); !sent.ok()) {
      Transfers::instance().finish(transfer, sent);
    }
  }
};

// Copies a leased range with process_vm_readv/writev, then ends the lease.
void copy_leased(const std::weak_ptr<proc::ProcHost>& weak, const ProcId& peer,
                 const std::shared_ptr<Transfer>& transfer, int64_t pid, uint64_t address) {
  absl::Status copied;
  const bool ran = Transfers::instance().copy_if_live(
      transfer, [&] { return link::copy_between(pid, address, transfer->bytes, transfer->length, transfer->write); },
      &copied);
  if (std::shared_ptr<proc::ProcHost> host = weak.lock()) {
    (void)send_message(*host, peer, header_of(v1::RdmaHeader::LEASE_END, transfer->id));
  }
  if (!ran) return;
  if (copied.ok()) return Transfers::instance().finish(transfer, RdmaResult{transfer->length, RdmaTransport::kSingleCopy});
  if (absl::IsPermissionDenied(copied) || absl::IsUnimplemented(copied)) {
    link::note_single_copy_refused(copied);
    return link::start_next(transfer);  // the shared segment, else the socket
  }
  Transfers::instance().finish(transfer, copied);
}

}  // namespace

void on_lease_granted(const std::weak_ptr<proc::ProcHost>& weak, proc::ProcHost& host, const ProcId& peer,
                      const v1::RdmaHeader& header) {
  std::shared_ptr<Transfer> transfer = Transfers::instance().find(header.op());
  if (transfer == nullptr) {  // timed out meanwhile: let the owner go
    (void)send_message(host, peer, header_of(v1::RdmaHeader::LEASE_END, header.op()));
    return;
  }
  // The lease must name the owner process of the handle, and (where the
  // kernel tells) the process at the other end of this connection: a peer
  // cannot point this process's copy at a third process's memory.
  const std::optional<long> connected = host.peer_pid(peer);
  if (header.pid() != transfer->remote.pid || transfer->remote.owner != peer || (connected && *connected != header.pid())) {
    (void)send_message(host, peer, header_of(v1::RdmaHeader::LEASE_END, header.op()));
    return Transfers::instance().finish(transfer, absl::InternalError(absl::StrCat("proc ", peer, " granted a lease in process ",
                                                             header.pid(), ", not the buffer's owner process ",
                                                             transfer->remote.pid)));
  }
  run_job(transfer->length, [weak, peer, transfer, pid = header.pid(), address = header.address()] {
    copy_leased(weak, peer, transfer, pid, address);
  });
}

link::Link& lease_link() {
  static auto* lease = new LeaseLink;
  return *lease;
}

void on_lease(proc::ProcHost& host, const ProcId& peer, const v1::RdmaHeader& header) {
  auto opened = Registry::instance().open(header.buffer(), header.write(), header.offset(), header.length());
  if (!opened.ok()) return send_failure(host, peer, header.op(), opened.status());
  if (is_device_memory((*opened)->view)) {  // its handle never offers single copy
    return send_failure(host, peer, header.op(),
                        absl::InvalidArgumentError(absl::StrCat("RDMA buffer ", header.buffer(),
                                                                " is device memory: no single copy (it is staged)")));
  }
  v1::RdmaHeader granted = header_of(v1::RdmaHeader::LEASE_GRANTED, header.op());
  granted.set_address(reinterpret_cast<uint64_t>((*opened)->base + header.offset()));
  granted.set_pid(::getpid());
  Registry::instance().pin(peer, header.op(), *std::move(opened));
  if (!send_message(host, peer, granted).ok()) Registry::instance().unpin(peer, header.op());
}

}  // namespace castmesh::rdma
