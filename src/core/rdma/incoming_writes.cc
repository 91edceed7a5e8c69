#include "core/rdma/incoming_writes.h"

#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/link/body_sink.h"
#include "core/rdma/device_staging.h"
#include "core/rdma/service.h"

namespace castmesh::rdma {

namespace v1 = wire::v1;

// Receives one chunk's body: into the registered memory itself (host
// memory), into a buffer copied in when complete (device memory), or past
// it (a failed chunk: its failure is reported once the body is read).
class IncomingWrites::Sink final : public link::BodySink {
 public:
  Sink(std::shared_ptr<IncomingWrites> writes, ProcId peer, uint64_t op, uint64_t offset, uint64_t size, Chunk chunk,
       Answer answer)
      : writes_(std::move(writes)),
        peer_(std::move(peer)),
        op_(op),
        offset_(offset),
        size_(size),
        chunk_(std::move(chunk)),
        answer_(std::move(answer)),
        in_place_(!chunk_.failure && chunk_.registration != nullptr &&
                  !is_device_memory(chunk_.registration->view)) {}

  std::optional<size_t> receive_wanted(size_t at, size_t n, const Take& take) override {
    if (in_place_) return take(chunk_.registration->base + offset_ + at, n);
    if (!chunk_.failure && chunk_.registration != nullptr) {  // device memory: staged
      staged_.resize(size_);
      return take(staged_.data() + at, n);
    }
    return std::nullopt;  // a failed chunk
  }

  void finish(bool complete) override {
    if (!complete) return;  // the connection was lost: forget_peer drops the write
    if (!in_place_ && !chunk_.failure && chunk_.registration != nullptr && size_ > 0) {
      absl::Status copied = copy_in(*chunk_.registration, offset_, staged_.data(), size_);
      if (!copied.ok()) chunk_.failure = copied;
    }
    if (auto answer = writes_->arrived(peer_, op_, size_, chunk_.failure)) answer_(*answer);
  }

 private:
  const std::shared_ptr<IncomingWrites> writes_;
  const ProcId peer_;
  const uint64_t op_;
  const uint64_t offset_;
  const uint64_t size_;
  Chunk chunk_;
  const Answer answer_;
  const bool in_place_;
  std::vector<char> staged_;
};

std::optional<v1::RdmaHeader> IncomingWrites::apply(const ProcId& peer, const v1::RdmaHeader& header,
                                                    const char* body, size_t size) {
  Chunk chunk = admit(peer, header, size);
  if (!chunk.failure && chunk.registration != nullptr && size > 0) {
    absl::Status copied = copy_in(*chunk.registration, header.offset(), body, size);
    if (!copied.ok()) chunk.failure = copied;
  }
  return arrived(peer, header.op(), size, chunk.failure);
}

std::shared_ptr<transport::PayloadSink> IncomingWrites::sink(const ProcId& peer, const v1::RdmaHeader& header,
                                                             uint64_t size, Answer answer) {
  return std::make_shared<Sink>(shared_from_this(), peer, header.op(), header.offset(), size,
                                admit(peer, header, size), std::move(answer));
}

void IncomingWrites::forget_peer(const ProcId& peer) {
  detail::MutexLock lock(mu_);
  absl::erase_if(writes_, [&peer](const auto& entry) { return entry.first.first == peer; });
}

IncomingWrites::Chunk IncomingWrites::admit(const ProcId& peer, const v1::RdmaHeader& header, size_t size) {
  detail::MutexLock lock(mu_);
  auto [it, fresh] = writes_.try_emplace(std::make_pair(peer, header.op()));
  Write& write = it->second;
  Chunk chunk;
  if (fresh) {
    write.op_offset = header.op_offset();
    write.length = header.length();
    auto opened = Registry::instance().open(header.buffer(), /*write=*/true, write.op_offset, write.length);
    if (opened.ok()) write.registration = *std::move(opened);
    else chunk.failure = opened.status();
  }
  if (write.registration == nullptr) return chunk;
  const bool inside = header.offset() >= write.op_offset && size <= write.length &&
                      header.offset() - write.op_offset <= write.length - size;
  if (!inside) {
    chunk.failure = absl::InvalidArgumentError(
        absl::StrCat("a chunk of ", size, " bytes at ", header.offset(), " lies outside the write's range"));
    return chunk;
  }
  chunk.registration = write.registration;
  return chunk;
}

std::optional<v1::RdmaHeader> IncomingWrites::arrived(const ProcId& peer, uint64_t op, size_t size,
                                                      const std::optional<absl::Status>& failure) {
  detail::MutexLock lock(mu_);
  auto it = writes_.find(std::make_pair(peer, op));
  if (it == writes_.end()) return std::nullopt;  // the peer was lost meanwhile
  Write& write = it->second;
  write.received += size;
  std::optional<v1::RdmaHeader> answer;
  if (failure && !write.failed) {
    write.failed = true;
    answer = failure_header(op, *failure);
  }
  if (write.received >= write.length) {
    if (!write.failed) answer = header_of(v1::RdmaHeader::WRITE_DONE, op);
    writes_.erase(it);
  }
  return answer;
}

}  // namespace castmesh::rdma
