#include "core/rdma/socket_link.h"

#include <algorithm>
#include <string_view>

#include "castmesh/detail/mutex.h"
#include "castmesh/wire/v1/rdma.pb.h"
#include "core/link/transfers.h"
#include "core/proc/proc_host.h"
#include "core/rdma/service.h"

namespace castmesh::rdma {
namespace {

namespace v1 = wire::v1;

void send_write_chunks(const std::shared_ptr<Transfer>& transfer) {
  const uint64_t chunk = chunk_bytes();
  // User memory with an owner leaves without a copy (the transfer keeps it
  // alive while queued); borrowed memory is copied, since the caller may
  // free it as soon as the operation reports a timeout.
  const bool share = transfer->local.owner() != nullptr;
  uint64_t at = 0;
  do {
    {
      detail::MutexLock lock(transfer->mu);
      if (transfer->finished) return;
    }
    std::shared_ptr<proc::ProcHost> host = transfer->host.lock();  // per chunk, as in send_read_chunks
    if (host == nullptr) return Transfers::instance().finish(transfer, absl::UnavailableError("this proc's transport is shut down"));
    const uint64_t n = std::min<uint64_t>(chunk, transfer->length - at);
    v1::RdmaHeader data = header_of(v1::RdmaHeader::WRITE_DATA, transfer->id);
    data.set_buffer(transfer->remote.id);
    data.set_offset(transfer->offset + at);
    data.set_op_offset(transfer->offset);
    data.set_length(transfer->length);
    const char* bytes = transfer->bytes + at;
    wire::Payload body = share ? wire::Payload::share(transfer, bytes, n)
                               : wire::Payload::copy_of(std::string_view(bytes, n));
    absl::Status sent = send_message(*host, transfer->remote.owner, data, std::move(body));
    if (!sent.ok()) return Transfers::instance().finish(transfer, sent);
    at += n;
  } while (at < transfer->length);
}

class SocketLink final : public link::Link {
 public:
  link::Path path(const ProcId&) const override { return link::Path::kSocket; }
  link::Capabilities capabilities() const override { return link::Capabilities{}; }
  void start(const std::shared_ptr<link::Transfer>& transfer) override {
    std::shared_ptr<proc::ProcHost> host = transfer->host.lock();
    if (host == nullptr) {
      return Transfers::instance().finish(transfer, absl::UnavailableError("this proc's transport is shut down"));
    }
    transfer->transport = RdmaTransport::kSocket;  // nothing else reads it before the first message goes
    v1::RdmaHeader first;
    if (transfer->release) {
      first = header_of(v1::RdmaHeader::RELEASE, transfer->id);
    } else if (transfer->write) {
      return run_job(transfer->length, [transfer] { send_write_chunks(transfer); });
    } else {
      first = header_of(v1::RdmaHeader::READ, transfer->id);
      first.set_offset(transfer->offset);
      first.set_length(transfer->length);
      first.set_chunk(chunk_bytes());
    }
    first.set_buffer(transfer->remote.id);
    if (absl::Status sent = send_message(*host, transfer->remote.owner, first); !sent.ok()) {
      Transfers::instance().finish(transfer, sent);
    }
  }
};

}  // namespace

link::Link& socket_link() {
  static auto* socket = new SocketLink;
  return *socket;
}

}  // namespace castmesh::rdma
