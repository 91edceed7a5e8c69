#include "core/rdma/read_sink.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"

namespace castmesh::rdma {
namespace {

class ReadSink final : public transport::PayloadSink {
 public:
  ReadSink(std::shared_ptr<Transfer> transfer, uint64_t offset, uint64_t size)
      : transfer_(std::move(transfer)),
        offset_(offset),
        size_(size),
        inside_(offset >= transfer_->offset && size <= transfer_->length &&
                offset - transfer_->offset <= transfer_->length - size) {}

  size_t receive(size_t at, size_t n, const std::function<size_t(char* into, size_t max)>& take) override {
    {
      detail::MutexLock lock(transfer_->mu);
      if (inside_ && !transfer_->finished) {
        const size_t got = take(transfer_->bytes + (offset_ - transfer_->offset) + at, n);
        transfer_->moved += got;
        return got;
      }
    }
    scratch_.resize(std::min<size_t>(n, 64 * 1024));  // not wanted: read past it
    return take(scratch_.data(), scratch_.size());
  }

  void finish(bool complete) override {
    if (!complete) return;  // the connection was lost: the owner's loss fails the transfer
    if (!inside_) {
      return Transfers::instance().finish(
          transfer_, absl::InternalError(absl::StrCat("proc ", transfer_->owner, " sent ", size_, " bytes at ",
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
  std::vector<char> scratch_;
};

}  // namespace

std::shared_ptr<transport::PayloadSink> make_read_sink(std::shared_ptr<Transfer> transfer, uint64_t offset,
                                                       uint64_t size) {
  return std::make_shared<ReadSink>(std::move(transfer), offset, size);
}

}  // namespace castmesh::rdma
