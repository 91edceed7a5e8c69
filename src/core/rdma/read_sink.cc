#include "core/rdma/read_sink.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"
#include "core/link/body_sink.h"

namespace castmesh::rdma {
namespace {

class ReadSink final : public link::BodySink {
 public:
  ReadSink(std::shared_ptr<Transfer> transfer, uint64_t offset, uint64_t size)
      : transfer_(std::move(transfer)),
        offset_(offset),
        size_(size),
        inside_(offset >= transfer_->offset && size <= transfer_->length &&
                offset - transfer_->offset <= transfer_->length - size) {}

  std::optional<size_t> receive_wanted(size_t at, size_t n, const Take& take) override {
    detail::MutexLock lock(transfer_->mu);
    if (!inside_ || transfer_->finished) return std::nullopt;
    const size_t got = take(transfer_->bytes + (offset_ - transfer_->offset) + at, n);
    transfer_->moved += got;
    return got;
  }

  void finish(bool complete) override {
    if (!complete) return;  // the connection was lost: the owner's loss fails the transfer
    if (!inside_) {
      return Transfers::instance().finish(
          transfer_, absl::InternalError(absl::StrCat("proc ", transfer_->remote.owner, " sent ", size_, " bytes at ",
                                                      offset_, ", outside the read of [", transfer_->offset, ", ",
                                                      transfer_->offset + transfer_->length, ")")));
    }
    bool done = false;
    {
      detail::MutexLock lock(transfer_->mu);
      done = !transfer_->finished && transfer_->moved == transfer_->length;
    }
    if (done) Transfers::instance().finish(transfer_, RdmaResult{transfer_->length, transfer_->transport});
  }

 private:
  const std::shared_ptr<Transfer> transfer_;
  const uint64_t offset_;
  const uint64_t size_;
  const bool inside_;
};

}  // namespace

std::shared_ptr<transport::PayloadSink> make_read_sink(std::shared_ptr<Transfer> transfer, uint64_t offset,
                                                       uint64_t size) {
  return std::make_shared<ReadSink>(std::move(transfer), offset, size);
}

}  // namespace castmesh::rdma
