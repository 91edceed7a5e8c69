// ScratchPool: landing memory of a communicator's pipelined collectives,
// kept between calls. A fresh buffer per call costs a zero fill and, above
// malloc's mmap threshold, a page fault per 4 KiB and an munmap on every
// call: a fifth of a 64 MiB two-rank allreduce over TCP, whose receives
// land in a scratch ring as large as half the message. Kept per
// communicator, like NCCL's buffers: what a group keeps goes with it.
//
// Thread-safe: concurrent calls on one communicator each lease their own.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "castmesh/detail/mutex.h"

namespace castmesh::collectives {

class ScratchPool {
 public:
  // Uninitialised memory of at least `bytes` bytes, this caller's until the
  // lease goes out of scope (then kept for the next call). Movable.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&&) noexcept = default;
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    char* data() const { return buffer_.bytes.get(); }

   private:
    friend class ScratchPool;
    struct Buffer {
      std::unique_ptr<char[]> bytes;
      size_t size = 0;
    };
    Lease(ScratchPool* pool, Buffer buffer) : pool_(pool), buffer_(std::move(buffer)) {}
    ScratchPool* pool_ = nullptr;
    Buffer buffer_;
  };

  // A lease of at least `bytes` bytes: the smallest idle buffer that is
  // large enough, else a new one. Any thread.
  Lease take(size_t bytes);

 private:
  using Buffer = Lease::Buffer;
  // Keeps `buffer` idle; beyond kMaxIdle the smallest idle one is freed.
  void give_back(Buffer buffer);

  // Concurrent pipelined calls on one communicator are rare (non-blocking
  // ones); two idle buffers serve a pair of them without reallocating.
  static constexpr size_t kMaxIdle = 2;
  detail::Mutex mu_;
  std::vector<Buffer> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace castmesh::collectives
