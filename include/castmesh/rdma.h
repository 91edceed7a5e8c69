// RDMA buffers: one-sided reads and writes of memory another proc
// registered, with the same calls on every machine.
//
// The owner registers a contiguous TensorView (host memory, or CUDA/ROCm
// memory served through host staging, docs/rdma.md); the RdmaBuffer handle is
// a small value that is copied, serialized, and sent inside any message
// (C++ or Python) to any proc. Any proc holding it reads the buffer's bytes
// into its own memory (read_into) or writes its bytes into the buffer
// (write_from) without the owner's actors taking part. Each operation picks
// the best transport the owner offers and this proc has (docs/rdma.md):
//
//   same process   one memcpy;
//   single copy    same host: process_vm_readv / process_vm_writev straight
//                  between the two processes' memory, while the owner holds
//                  a lease on the range (released buffers refuse new ones);
//   shared segment same host where the kernel refuses cross-memory
//                  attach: a POSIX shared-memory window the owner copies
//                  chunks into and this proc copies them out of, pipelined;
//   socket         otherwise: the proc connection carries the bytes in chunks,
//                  all in flight at once (no per-chunk round trip); the
//                  owner sends straight from the registered memory.
//
//   ibverbs        (tried first) both procs have an RDMA NIC: one-sided
//                  RDMA READ/WRITE through the rdma backend (docs/rdma.md).
//
// CASTMESH_RDMA_FALLBACK=auto|error (docs/config.md; per operation:
// RdmaOptions::fallback): `error` makes an operation that would need a
// fallback transport fail instead (kFailedPrecondition); `auto` (default)
// logs once per proc which path carries RDMA traffic.
//
// A failed or timed-out operation writes no byte into a read's destination
// after it has reported the failure. A write that timed out may have been
// applied in part at the owner (as with a NIC's failed RDMA WRITE): the
// owner's range is then undefined, never bytes outside it.
//
// Threading: every method may be called from any thread (actor handlers,
// plain threads of a process with a runtime); Futures complete on runtime
// I/O or timer threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "castmesh/address.h"
#include "castmesh/config.h"
#include "castmesh/future.h"
#include "castmesh/tensor.h"

namespace castmesh {

class Runtime;

// What other procs may do with a registered buffer.
enum class RdmaAccess : uint32_t { kRead = 1, kWrite = 2, kReadWrite = 3 };

// How an operation's bytes moved, best first.
// (Values are wire numbers; kSharedSegment ranks before kSocket.)
enum class RdmaTransport : uint32_t {
  kIbverbs = 1,
  kSameProcess = 2,
  kSingleCopy = 3,
  kSocket = 4,
  kSharedSegment = 5,
};

// "ibverbs", "same_process", "single_copy", "shared_segment", "socket".
std::string_view rdma_transport_name(RdmaTransport transport);

// The outcome of one finished operation.
struct RdmaResult {
  size_t bytes = 0;                                // bytes moved
  RdmaTransport transport = RdmaTransport::kSocket;  // the path that moved them
  bool staged = false;  // device memory (either side) went through host memory (docs/rdma.md)
};

// The transport's name, with "+host_staging" when the bytes were staged
// ("socket+host_staging"): what Python's RdmaResult.transport says.
std::string rdma_result_transport(const RdmaResult& result);

// Where in the buffer an operation applies, and for how long it may take.
struct RdmaOptions {
  size_t offset = 0;                      // first byte of the remote buffer
  std::optional<size_t> length{};         // read: bytes (default: the destination's size); write: ignored
  absl::Duration timeout = absl::Seconds(60);
  Runtime* runtime = nullptr;             // the runtime that sends; nullptr: Runtime::current()
  // This operation's CASTMESH_RDMA_FALLBACK; unset: the settings table's (config::global().rdma_fallback).
  std::optional<config::RdmaFallback> fallback{};
};

namespace detail {
struct RdmaHandle;
}

// A handle on memory registered by one proc. Copyable; cheap to copy.
class RdmaBuffer {
 public:
  // An empty handle (every operation fails with kFailedPrecondition).
  RdmaBuffer();

  // Registers `view` (C-contiguous, not read-only when `access` includes
  // kWrite) as a buffer of this proc. Device memory (CUDA/ROCm) needs the
  // tensor_engine backend and is served through host staging; device work
  // writing it must have completed before peers read it. The view's owner
  // is kept alive until the buffer is released and no operation on it is
  // in flight; memory without an owner must outlive that. `runtime`
  // (nullptr: Runtime::current()) names the owner proc.
  static absl::StatusOr<RdmaBuffer> register_memory(const TensorView& view,
                                                    RdmaAccess access = RdmaAccess::kReadWrite,
                                                    Runtime* runtime = nullptr);

  // The bytes a handle is sent as, and back. deserialize: kInvalidArgument
  // on malformed bytes.
  std::string serialize() const;
  static absl::StatusOr<RdmaBuffer> deserialize(std::string_view bytes);

  // Registered bytes.
  size_t size() const;
  // The proc whose memory this is.
  const ProcId& owner() const;
  // What other procs may do with it.
  RdmaAccess access() const;
  // The transports the owner offers, best first. A buffer over device
  // memory offers only those in which the owner's CPU stages the bytes.
  std::vector<RdmaTransport> transports() const;
  // Where the owner's memory lives (cpu, or cuda:N / rocm:N: staged).
  Device device() const;
  // False for a default-constructed handle.
  bool valid() const { return handle_ != nullptr; }

  // Copies `length` bytes (default dst.nbytes()) of the buffer from
  // `offset` into `dst` (C-contiguous, writable, at least that big; device
  // memory goes through host staging and holds the bytes when this resolves).
  // Errors before any byte moves: kOutOfRange (range past the end),
  // kInvalidArgument (bad destination), kPermissionDenied (not readable),
  // kFailedPrecondition (released or unknown buffer). Later:
  // kDeadlineExceeded, kUnavailable (owner lost).
  Future<RdmaResult> read_into(const TensorView& dst, RdmaOptions options = {}) const;
  // Copies all of `src` into the buffer at `offset`; errors as read_into.
  // Device memory is copied to the host (synchronised) before bytes are sent.
  Future<RdmaResult> write_from(const TensorView& src, RdmaOptions options = {}) const;

  // Releases the registration (from any proc; idempotent). Operations that
  // start afterwards fail with kFailedPrecondition; those in flight finish.
  // Resolves once the owner has marked it released.
  Future<Unit> release(absl::Duration timeout = absl::Seconds(60), Runtime* runtime = nullptr) const;

  // "RdmaBuffer(1048576 bytes of unix:@castmesh-1-.., read_write)".
  std::string to_string() const;

 private:
  friend class RdmaBatch;
  explicit RdmaBuffer(std::shared_ptr<const detail::RdmaHandle> handle) : handle_(std::move(handle)) {}
  std::shared_ptr<const detail::RdmaHandle> handle_;
};

// Several reads and writes (on one or more buffers) with one completion.
// Build it on one thread; submit() once.
class RdmaBatch {
 public:
  // Adds a read of `options.length` bytes at `options.offset` into `dst`.
  absl::Status add_read(const RdmaBuffer& buffer, const TensorView& dst, RdmaOptions options = {});
  // Adds a write of `src` at `options.offset`. kInvalidArgument when it
  // overlaps a write already in the batch to the same buffer (their order
  // would be undefined).
  absl::Status add_write(const RdmaBuffer& buffer, const TensorView& src, RdmaOptions options = {});
  // Number of operations added.
  size_t size() const { return ops_.size(); }
  // Starts every operation; resolves with their results in order once all
  // succeeded, or with the first error (the rest still finish or time out).
  Future<std::vector<RdmaResult>> submit(absl::Duration timeout = absl::Seconds(60), Runtime* runtime = nullptr);

 private:
  struct Op {
    RdmaBuffer buffer;
    TensorView view;
    RdmaOptions options;
    bool write = false;
  };
  std::vector<Op> ops_;
  bool submitted_ = false;
};

}  // namespace castmesh
