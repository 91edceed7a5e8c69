// The owner side of socket writes (WRITE_DATA chunks, and the shared
// segment's SEGMENT_WRITE_DATA): which writes into this proc's buffers are
// in progress, where each chunk goes, and the one answer each write gets
// (WRITE_DONE once every byte arrived, or FAILED with the first error).
//
// A chunk whose payload the transport has not read yet is received in place
// through sink(): straight from the socket into the registered memory, so
// its bytes cross memory once on this side, as a read's do (read_sink.h).
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/address.h"
#include "castmesh/wire/v1/rdma.pb.h"
#include "core/rdma/registry.h"
#include "core/transport/endpoint.h"

namespace castmesh::rdma {

class IncomingWrites : public std::enable_shared_from_this<IncomingWrites> {
 public:
  // Sends an answer to the writer (WRITE_DONE or FAILED).
  using Answer = std::function<void(const wire::v1::RdmaHeader& answer)>;

  // Applies one chunk whose body has arrived; returns the answer to send, if any.
  std::optional<wire::v1::RdmaHeader> apply(const ProcId& peer, const wire::v1::RdmaHeader& header,
                                            const char* body, size_t size);
  // A sink that receives the `size`-byte body of the chunk `header` in place
  // and, once it is complete, calls `answer` with the write's answer if it
  // has one. I/O thread; never blocks.
  std::shared_ptr<transport::PayloadSink> sink(const ProcId& peer, const wire::v1::RdmaHeader& header,
                                               uint64_t size, Answer answer);
  // Forgets the writes of a lost peer.
  void forget_peer(const ProcId& peer);

 private:
  class Sink;
  struct Write {
    std::shared_ptr<const Registration> registration;  // null once the buffer could not be opened
    uint64_t op_offset = 0;
    uint64_t length = 0;
    uint64_t received = 0;
    bool failed = false;
  };
  // Where one chunk's bytes go: its write's registration (null: nowhere),
  // or the failure to report for it.
  struct Chunk {
    std::shared_ptr<const Registration> registration;
    std::optional<absl::Status> failure;
  };

  // Checks a chunk of `size` bytes (opening the buffer at its write's first chunk).
  Chunk admit(const ProcId& peer, const wire::v1::RdmaHeader& header, size_t size);
  // Counts `size` bytes of write `op` as arrived, with the chunk's failure.
  std::optional<wire::v1::RdmaHeader> arrived(const ProcId& peer, uint64_t op, size_t size,
                                              const std::optional<absl::Status>& failure);

  detail::Mutex mu_;
  absl::flat_hash_map<std::pair<ProcId, uint64_t>, Write> writes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace castmesh::rdma
