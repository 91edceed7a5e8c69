#include "core/rdma/service.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "castmesh/config.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/wire/v1/rdma.pb.h"
#include "core/log/log.h"
#include "core/platform/process_memory.h"
#include "core/proc/proc_host.h"
#include "core/rdma/device_staging.h"
#include "core/rdma/ibverbs_path.h"
#include "core/rdma/incoming_writes.h"
#include "core/rdma/lease_link.h"
#include "core/rdma/one_sided.h"
#include "core/rdma/read_sink.h"
#include "core/rdma/registration.h"
#include "core/rdma/registry.h"
#include "core/rdma/segment_path.h"
#include "core/wire/frame.h"
#include "core/progress/progress_engine.h"

namespace castmesh::rdma {
namespace {

namespace v1 = wire::v1;

// Operations at least this big send or copy on a thread of their own.
constexpr size_t kOwnThreadBytes = 256 * 1024;
// Bounds on a requester's chunk size (a peer's number is not trusted).
constexpr uint64_t kMinChunk = 1024;
constexpr uint64_t kMaxChunk = uint64_t{64} << 20;

absl::Status send(proc::ProcHost& host, const ProcId& peer, const v1::RdmaHeader& header, wire::Payload body = {}) {
  return send_message(host, peer, header, std::move(body));
}

absl::Status status_of(const v1::RdmaHeader& header) {
  const auto code = static_cast<absl::StatusCode>(header.error_code());
  if (code == absl::StatusCode::kOk || header.error_code() < 0 || header.error_code() > 16) {
    return absl::UnknownError(absl::StrCat("the owner failed the operation: ", header.error_message()));
  }
  return absl::Status(code, header.error_message());
}

// ---- owner side ----

// Sends [offset, offset+length) of `registration` as READ_DATA chunks,
// straight from its memory (each chunk keeps the registration alive until
// the transport has written it), or staged in pinned host memory (device memory).
void send_read_chunks(const std::weak_ptr<proc::ProcHost>& weak, const ProcId& peer, uint64_t op,
                      const std::shared_ptr<const Registration>& registration, uint64_t offset, uint64_t length,
                      uint64_t chunk) {
  ReadStager stager(registration);
  uint64_t at = offset;
  do {
    const uint64_t n = std::min(chunk, offset + length - at);
    absl::StatusOr<wire::Payload> body = stager.chunk(at, n);  // may wait for an earlier staged chunk to go
    // Locked per chunk: a long send must not keep a closing proc's host alive.
    std::shared_ptr<proc::ProcHost> host = weak.lock();
    if (host == nullptr) return;
    if (!body.ok()) return send_failure(*host, peer, op, body.status());
    v1::RdmaHeader data = header_of(v1::RdmaHeader::READ_DATA, op);
    data.set_offset(at);
    absl::Status sent = send(*host, peer, data, *std::move(body));
    if (!sent.ok()) return send_failure(*host, peer, op, sent);
    at += n;
  } while (at < offset + length);
}

void on_read(const std::weak_ptr<proc::ProcHost>& weak, proc::ProcHost& host, const ProcId& peer,
             const v1::RdmaHeader& header) {
  auto opened = Registry::instance().open(header.buffer(), /*write=*/false, header.offset(), header.length());
  if (!opened.ok()) return send_failure(host, peer, header.op(), opened.status());
  const uint64_t chunk = std::clamp<uint64_t>(header.chunk(), kMinChunk, kMaxChunk);
  // Staging device memory waits for sent chunks past kStagedChunksPerRead:
  // never on an I/O thread. Fewer chunks are staged here (no thread to start).
  const bool may_wait = is_device_memory((*opened)->view) && header.length() > chunk * kStagedChunksPerRead;
  run_job(may_wait ? kOwnThreadBytes : header.length(), [weak, peer, op = header.op(), registration = *std::move(opened),
                            offset = header.offset(), length = header.length(), chunk] {
    send_read_chunks(weak, peer, op, registration, offset, length, chunk);
  });
}

// ---- requester side ----

void finish(const std::shared_ptr<Transfer>& transfer, absl::StatusOr<RdmaResult> result) {
  Transfers::instance().finish(transfer, std::move(result));
}

void on_requester_message(const std::weak_ptr<proc::ProcHost>& weak, proc::ProcHost& host, const ProcId& peer,
                          const v1::RdmaHeader& header, const wire::Payload& body) {
  if (header.kind() == v1::RdmaHeader::LEASE_GRANTED) return on_lease_granted(weak, host, peer, header);
  std::shared_ptr<Transfer> transfer = Transfers::instance().find(header.op());
  if (transfer == nullptr || transfer->remote.owner != peer) return;  // finished already (late answer)
  switch (header.kind()) {
    case v1::RdmaHeader::READ_DATA:
      return Transfers::instance().deliver(transfer, header.offset(), body.data(), body.size());
    case v1::RdmaHeader::WRITE_DONE:
      return finish(transfer, RdmaResult{transfer->length, transfer->transport});
    case v1::RdmaHeader::RELEASED:
      return finish(transfer, RdmaResult{0, transfer->transport});
    case v1::RdmaHeader::FAILED:
      return finish(transfer, status_of(header));
    default:
      return;
  }
}

// RELEASE: takes the buffer out of service at once (later operations fail),
// and answers RELEASED once its memory is no longer used by any transport:
// one-sided copies left, ibverbs peers drained (RELEASING reaches them
// before RELEASED reaches the releaser), socket and segment operations done.
void on_release(const std::weak_ptr<proc::ProcHost>& weak, proc::ProcHost& host, const ProcId& peer,
                const v1::RdmaHeader& header) {
  std::shared_ptr<const Registration> released = Registry::instance().release(header.buffer());
  if (released == nullptr) {  // released before (idempotent) or never registered
    (void)send(host, peer, header_of(v1::RdmaHeader::RELEASED, header.op()));
    return;
  }
  retire_from_paths(released, &host);
  when_freed(std::move(released), [weak, peer, op = header.op()] {
    if (std::shared_ptr<proc::ProcHost> host = weak.lock()) {
      (void)send(*host, peer, header_of(v1::RdmaHeader::RELEASED, op));
    }
  });
}

// Both sides of one ProcHost's RDMA traffic.
class RdmaService final : public proc::ProcService {
 public:
  explicit RdmaService(proc::ProcHost& host) : writes_(std::make_shared<IncomingWrites>()) {
    std::weak_ptr<proc::ProcHost> weak = host.shared_from_this();
    host.on_data(kRdmaDataType, [weak, writes = writes_](const ProcId& peer, std::string_view header_bytes,
                                                          wire::Payload payload) {
      std::shared_ptr<proc::ProcHost> host = weak.lock();
      v1::RdmaHeader header;
      if (host == nullptr) return;
      if (!wire::parse_message(header_bytes, header)) {
        CASTMESH_LOG_WARN("castmesh-rdma: dropping a malformed message from {}", peer);
        return;
      }
      dispatch(weak, *host, *writes, peer, header, payload);
    });
    // Read chunks land straight in the destination (read_sink.h), write
    // chunks straight in the registered memory (incoming_writes.h).
    host.on_data_sink(kRdmaDataType, [weak, writes = writes_](
                                         const ProcId& peer, std::string_view header_bytes,
                                         uint64_t size) -> std::shared_ptr<transport::PayloadSink> {
      v1::RdmaHeader header;
      if (!wire::parse_message(header_bytes, header)) return nullptr;
      if (header.kind() == v1::RdmaHeader::WRITE_DATA) {
        return writes->sink(peer, header, size, [weak, peer](const v1::RdmaHeader& answer) {
          if (std::shared_ptr<proc::ProcHost> host = weak.lock()) (void)send(*host, peer, answer);
        });
      }
      if (header.kind() != v1::RdmaHeader::READ_DATA) return nullptr;
      std::shared_ptr<Transfer> transfer = Transfers::instance().find(header.op());
      if (transfer == nullptr || transfer->remote.owner != peer) return nullptr;  // late: the handler drops it
      return make_read_sink(std::move(transfer), header.offset(), size);
    });
    host.add_peer_lost_observer([writes = writes_](const ProcId& peer, const absl::Status& why) {
      Transfers::instance().owner_lost(peer, why);
      IbverbsPath::instance().peer_lost(peer);
      Registry::instance().forget_peer(peer);
      writes->forget_peer(peer);
      segment_peer_lost(peer);
      one_sided_peer_lost(peer);
    });
  }
  void detach() override {}

 private:
  static void dispatch(const std::weak_ptr<proc::ProcHost>& weak, proc::ProcHost& host, IncomingWrites& writes,
                       const ProcId& peer, const v1::RdmaHeader& header, const wire::Payload& body) {
    switch (header.kind()) {
      case v1::RdmaHeader::READ:
        return on_read(weak, host, peer, header);
      case v1::RdmaHeader::WRITE_DATA:
        if (auto answer = writes.apply(peer, header, body.data(), body.size())) (void)send(host, peer, *answer);
        return;
      case v1::RdmaHeader::LEASE:
        return on_lease(host, peer, header);
      case v1::RdmaHeader::LEASE_END:
        return Registry::instance().unpin(peer, header.op());
      case v1::RdmaHeader::RELEASE:
        return on_release(weak, host, peer, header);
      case v1::RdmaHeader::TABLE_OPEN:
        return one_sided_on_table_open(host, peer, header);
      case v1::RdmaHeader::TABLE:
        return one_sided_on_table(host, peer, header);
      case v1::RdmaHeader::RELEASING:
        return IbverbsPath::instance().on_releasing(host, peer, header);
      case v1::RdmaHeader::DRAINED:
        return IbverbsPath::instance().on_drained(peer, header);
      case v1::RdmaHeader::CONNECT:
        return IbverbsPath::instance().on_connect(host, peer, header);
      case v1::RdmaHeader::CONNECTED:
        return IbverbsPath::instance().on_connected(peer, header);
      case v1::RdmaHeader::SEGMENT_READ:
      case v1::RdmaHeader::SEGMENT_DATA:
      case v1::RdmaHeader::SEGMENT_WRITE_DATA:
      case v1::RdmaHeader::SEGMENT_FREE:
      case v1::RdmaHeader::SEGMENT_CLOSE:
      case v1::RdmaHeader::SEGMENT_REFUSED:
        return on_segment_message(weak, host, peer, header, [&](const char* bytes, size_t size) {
          return writes.apply(peer, header, bytes, size);
        });
      case v1::RdmaHeader::READ_DATA:
      case v1::RdmaHeader::WRITE_DONE:
      case v1::RdmaHeader::LEASE_GRANTED:
      case v1::RdmaHeader::FAILED:
      case v1::RdmaHeader::RELEASED:
        return on_requester_message(weak, host, peer, header, body);
      default:
        CASTMESH_LOG_WARN("castmesh-rdma: dropping a message of unknown kind {} from {}",
                          static_cast<int>(header.kind()), peer);
    }
  }

  std::shared_ptr<IncomingWrites> writes_;
};

[[maybe_unused]] const bool kRegistered = [] {
  proc::register_proc_service("rdma", [](proc::ProcHost& host) -> std::shared_ptr<proc::ProcService> {
    return std::make_shared<RdmaService>(host);
  });
  return true;
}();

}  // namespace

v1::RdmaHeader header_of(v1::RdmaHeader::Kind kind, uint64_t op) {
  v1::RdmaHeader header;
  header.set_kind(kind);
  header.set_op(op);
  return header;
}

v1::RdmaHeader failure_header(uint64_t op, const absl::Status& why, v1::RdmaHeader::Kind kind) {
  v1::RdmaHeader failed = header_of(kind, op);
  failed.set_error_code(static_cast<int32_t>(why.code()));
  failed.set_error_message(std::string(why.message()));
  return failed;
}

void send_failure(proc::ProcHost& host, const ProcId& peer, uint64_t op, const absl::Status& why,
                  v1::RdmaHeader::Kind kind) {
  (void)send(host, peer, failure_header(op, why, kind));  // a lost peer needs no answer
}

absl::Status send_message(proc::ProcHost& host, const ProcId& peer, const v1::RdmaHeader& header, wire::Payload body) {
  return host.send_data(peer, kRdmaDataType, header.SerializeAsString(), std::move(body));
}

size_t chunk_bytes() {
  // The table admits kMinChunk..kMaxChunk only; the clamp keeps this file's limits the rule.
  return static_cast<size_t>(std::clamp(config::global().rdma_chunk_bytes, kMinChunk, kMaxChunk));
}


void run_job(size_t bytes, std::function<void()> job) {
  if (bytes < kOwnThreadBytes) return job();
  progress::ProgressEngine::instance().submit(progress::Job{std::move(job), {}});
}

}  // namespace castmesh::rdma
