// The link layer: one interface for moving bytes between two procs, below
// the collectives (and, later, RDMA buffers) and above the transport and
// the shared-memory rings. An algorithm asks the selector (selector.h) for
// the route to a peer for a message size, then posts its send on the
// route's link and reads the link's capabilities; it never names a path.
//
// Receives are not per link: every link delivers into the receiving rank's
// matching layer (collectives/rank_mailbox.h), where receives are posted,
// so a receive from any source matches whichever link its message took and
// MPI's order per (source, tag) holds across links.
//
// Completion is a progress::RequestState (core/progress/request_state.h),
// waited on through the progress engine; a link adds no waiting scheme.
// Failures are absl::Status: kUnavailable when the peer is gone,
// kDeadlineExceeded when a wait ran out, kAborted for a send abandoned by
// its failed operation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "castmesh/address.h"
#include "core/progress/request_state.h"

namespace castmesh::link {

// Every way bytes move between two procs; what an operation reports as the
// path it used (path_name). Not every path has a Link yet (docs/architecture.md,
// "Link layer").
enum class Path : uint8_t {
  kInProcess,      // both ranks in this process: one memcpy into the receive
  kShmRing,        // a shared-memory ring between two procs of a host (shm_link/)
  kSingleCopy,     // process_vm_readv/writev between two procs of a host
  kSocket,         // the procs' transport connection
  kSharedSegment,  // an RDMA buffer's shared segment (rdma/)
  kIbverbs,        // an RDMA NIC (rdma plugin)
  kDeviceStaging,  // CUDA/ROCm memory staged by its owner (tensor_engine plugin)
  kFake,           // tests only (tests/core/link/fake_link.h)
};
// The path's name in logs and results ("in_process", "shm_ring", ...). Any thread.
std::string_view path_name(Path path);

// What a link can do; read by the selector and by algorithms (how many
// receives to post ahead, whether an unwinding operation must wait for its
// sends). Fixed for a link's lifetime.
struct Capabilities {
  // read()/write() reach a peer's registered Region without its threads.
  bool one_sided = false;
  // Bytes cross memory once, from the sender's buffer into the receiver's.
  bool zero_copy = false;
  // Either side may be CUDA/ROCm memory.
  bool device_memory = false;
  // The largest message one post_send carries.
  size_t max_message = std::numeric_limits<size_t>::max();
  // post_send's request completes only when the link reads `data` no more;
  // until then the buffer must stay valid and unchanged.
  bool send_holds_buffer = false;
  // The bytes move when the receiver matches the message (an offer the
  // receiver reads): one that finds no posted receive costs no copy, so a
  // receiver needs only a few receives posted ahead. An unwinding operation
  // calls abandon_send instead of waiting (the peer may never answer).
  bool send_waits_for_receive = false;
};

// How a message is matched at the receiver: the communicator, the ranks,
// the channel (collective or point-to-point), tag, and the collective's
// sequence and call signature. Views: valid during the call only.
struct Envelope {
  std::string_view comm;
  int source = 0;
  int dest = 0;
  bool collective = false;
  int64_t tag = 0;
  uint64_t sequence = 0;
  std::string_view signature;
};

// Memory registered for one-sided access: what a peer needs to read or
// write it (the owner's process and host, and the range). The single
// registration both collectives' single-copy offers and RDMA buffers
// describe their memory with; each link reads the fields of its path.
struct Region {
  int64_t pid = 0;
  std::string host_identity;  // platform::host_identity() of the owner
  uint64_t address = 0;       // in the owner's address space (0: known to the owner only)
  size_t bytes = 0;
  ProcId owner;               // the owner proc (RDMA buffers; empty for an offer)
  uint64_t id = 0;            // the owner's registration id (RDMA buffers)
  uint64_t nic_address = 0;   // ibverbs: the NIC address of the first byte (0: no NIC range)
  uint32_t rkey = 0;          // ibverbs: the remote key
  // Same-host one-sided copies: the region's slot in the owner's
  // registration tables (rdma/one_sided.h); generation 0: none.
  uint32_t table_slot = 0;
  uint64_t table_generation = 0;
  // [offset, offset + length) lies inside the region.
  bool contains(uint64_t offset, size_t length) const { return offset <= bytes && length <= bytes - offset; }
};
// This process's memory [data, data + bytes) as a Region. Any thread.
Region local_region(const void* data, size_t bytes);

struct Transfer;  // transfers.h

// One way of moving bytes to peer procs. Implementations: in_process_link.h,
// frame_link.h (shared-memory ring, else the socket), single_copy_link.h;
// RDMA buffers' one-sided links (start()) in rdma/*_link.h.
// Thread-safe: every method may be called from any thread unless it says.
class Link {
 public:
  virtual ~Link() = default;
  // The path this link takes to `peer` now (a frame link reports the ring
  // once it is up, else the socket).
  virtual Path path(const ProcId& peer) const = 0;
  virtual Capabilities capabilities() const = 0;

  // Sends message `envelope` of `bytes` at `data` to proc `peer` when that
  // completes before returning (the bytes were copied out): its result;
  // nullopt when the send would stay in flight (then call post_send). Lets
  // small messages go without a request allocated. Caller's thread.
  virtual std::optional<absl::Status> send_now(const ProcId& peer, const Envelope& envelope, const void* data,
                                               size_t bytes) {
    (void)peer, (void)envelope, (void)data, (void)bytes;
    return std::nullopt;
  }
  // Starts sending; the request completes with {source, tag, bytes} or the
  // failure. With send_holds_buffer, `data` is read until it completes.
  // Caller's thread.
  // A link without two-sided sends (one-sided only) fails it with kUnimplemented.
  virtual std::shared_ptr<detail::RequestState> post_send(const ProcId& peer, const Envelope& envelope,
                                                          const void* data, size_t bytes);
  // Tells rank envelope.dest of proc `peer` that collective
  // envelope.sequence failed here (`why`): its receives of that collective
  // fail. Ahead of nothing: an abort may overtake the collective's data.
  // Any thread.
  virtual absl::Status send_abort(const ProcId& peer, const Envelope& envelope, const absl::Status& why);
  // A send of a failed operation that may still be in flight: when this
  // returns the link reads its buffer no more (no late bytes), and the
  // request is complete. The sending thread, before its buffers go.
  virtual void abandon_send(const std::shared_ptr<detail::RequestState>& request) {
    (void)request->wait(absl::InfiniteDuration());
  }
  // Proc `peer` is lost: sends in flight to it fail with `why`. Any thread.
  virtual void peer_lost(const ProcId& peer, const absl::Status& why) { (void)peer, (void)why; }

  // One-sided: copies `bytes` from `remote` at `offset` into `out` (read),
  // or from `in` into it (write), without the owner's threads. kUnimplemented
  // unless capabilities().one_sided; kOutOfRange outside the region;
  // kUnavailable when the owner is gone. Caller's thread.
  virtual absl::Status read(const Region& remote, uint64_t offset, void* out, size_t bytes);
  virtual absl::Status write(const Region& remote, uint64_t offset, const void* in, size_t bytes);

  // One-sided, asynchronous: carries `transfer` (a read, write or release of
  // transfer->remote, tracked by Transfers) and completes it through
  // Transfers; where this link finds its path refused it hands the transfer
  // on (start_next). The default hands it on. Caller's thread (it may
  // move the work to the progress engine).
  virtual void start(const std::shared_ptr<Transfer>& transfer);
  // One-sided, now: copies `length` bytes between `local` and `remote` at
  // `offset` (into the region when `write`) when that completes on the
  // caller's thread before returning (small same-host copies), by
  // path(remote.owner): its outcome; nullopt when it must go through a
  // Transfer and start(). Allocates nothing. Caller's thread.
  virtual std::optional<absl::Status> start_now(const Region& remote, uint64_t offset, char* local, size_t length,
                                                bool write) {
    (void)remote, (void)offset, (void)local, (void)length, (void)write;
    return std::nullopt;
  }
};

}  // namespace castmesh::link
