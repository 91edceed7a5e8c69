// The shared-memory ring path: communicator frames between two procs of one host through a
// shared-memory ring (core/shm_link/shm_ring.h) instead of their socket:
// one ring per ordered pair of procs, made by the sender on its first frame
// to that peer.
//
// Switch-over, in band so MPI's non-overtaking order holds: the sender
// creates the segment and sends LINK_OFFER over the socket (frames keep
// going over the socket); the receiver maps it and answers LINK_ACCEPT (or
// why not); the sender then sends LINK_START over the socket and from then
// on every frame to that peer (data, single-copy offers and their answers,
// aborts) goes through the ring. The receiver consumes the ring only once
// its I/O thread has handled LINK_START, i.e. every earlier socket frame.
//
// Progress (core/progress/progress_engine.h): the inbound rings are the
// engine's first wait source: a thread that waits on a request spins on
// them for up to 1 ms under the engine's wait policy (wait_policy.h), then
// sleeps on all its rings' waiter bells and its request's word at once
// (futex_waitv) and reads the rings itself when a producer wakes it: one
// wake-up per message. The engine's progress thread sleeps on every ring's
// doorbell and reads a ring only while no thread waits on it (unexpected
// messages, ranks busy elsewhere); where futex_waitv is missing the waiter
// sleeps on its request after its spin and the progress thread serves it. Consumers take a
// per-ring try-lock. Records go to the receiver (receiver.h: the
// collectives' Exchange) like socket frames: one matching path.
//
// Back-pressure: a caller's send waits for ring space (checking the peer is
// alive); a send from a progress context (an I/O thread, the progress thread, a
// consumer: e.g. a single-copy answer) never waits: when the ring is full it
// is queued per peer and flushed, in order, before the next frame to that
// peer, or by the progress thread.
//
// Bodies above a quarter of the ring travel as a first record (the header
// and total size) and continuation chunks, reassembled by the consumer.
//
// CASTMESH_SHM=0 turns the path off. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "castmesh/address.h"
#include "core/link/link.h"

namespace castmesh::proc {
class ProcHost;
}
namespace castmesh::wire::v1 {
class CollectiveHeader;
}

namespace castmesh::link {

// Each ring's capacity (per direction, per pair of procs).
inline constexpr size_t kShmRingBytes = size_t{1} << 20;

// Sends one communicator frame (serialized CollectiveHeader `header`, raw
// `body`) to proc `peer`: through the shm link when it is up, else over the
// proc's connection. Any thread. With `body_owner`, a body that goes over
// the socket is written from `body` itself (no copy) and `body_owner` is
// released once the transport is done with it (a ring copies it at once).
absl::Status send_collective_frame(proc::ProcHost& host, const ProcId& peer, std::string_view header,
                                   std::string_view body, std::shared_ptr<const void> body_owner = nullptr);

// Sends `message` + `body` to proc `peer` as one compact ring record (a data
// message: a point-to-point message or a collective step without single
// copy; its envelope's ranks, channel, tag and sequence in a fixed binary
// header, then `comm` and `signature`, then the body), from a
// caller thread: no protobuf header, nothing allocated. nullopt when it did
// not (no started link to `peer` yet, a receiver that reads only frames, a
// progress context, a record larger than a ring chunk): the caller then
// sends it as a frame (send_collective_frame), which keeps the order since a
// started link carries every later frame too.
std::optional<absl::Status> try_send_compact(const ProcId& peer, const Envelope& message,
                                             std::string_view body);

// Marks the calling thread, for its lifetime, as a progress context (an I/O
// thread delivering frames): its sends to a full ring are queued, never
// waited for.
class ShmProgressScope {
 public:
  ShmProgressScope();
  ~ShmProgressScope();
  ShmProgressScope(const ShmProgressScope&) = delete;
  ShmProgressScope& operator=(const ShmProgressScope&) = delete;

 private:
  bool saved_;
};

// Held by a thread for the whole of a large collective (through
// link::PollScope) that alternates between waiting on this process's inbound
// rings and computing: the rings count as polled for its lifetime, so
// producers do not wake the progress thread for records that arrive while it
// computes, and the progress thread leaves those records to it (its next wait
// reads them; the destructor reads what is left). The progress thread woken
// mid-collective would take a core from the ranks themselves.
class ShmPollScope {
 public:
  ShmPollScope();
  ~ShmPollScope();
  ShmPollScope(const ShmPollScope&) = delete;
  ShmPollScope& operator=(const ShmPollScope&) = delete;

 private:
  std::shared_ptr<const void> rings_;  // the inbound rings marked polled
};

// Link handshake frames from `peer` (kCollectiveLinkDataType, on `host`'s I/O thread).
void on_shm_link_frame(proc::ProcHost& host, const ProcId& peer,
                       const wire::v1::CollectiveHeader& header);
// Proc `peer` is lost: whatever it wrote to its ring is handed on first,
// then its links are torn down and senders blocked on them fail.
void on_shm_peer_lost(const ProcId& peer, const absl::Status& why);
// Proc `peer` answers again after being reported lost: a new link may form.
void on_shm_peer_alive(const ProcId& peer);

// Whether frames to proc `peer` go through its shared-memory ring now (else
// the socket): the path a frame link reports. Takes the links' lock: for
// reports, not for every message. Any thread.
bool shm_link_started(const ProcId& peer);

// Counters for tests and benchmarks: frames this process received and sent
// through shm rings, and the rings up in each direction.
struct ShmPathStats {
  uint64_t frames_in = 0;
  uint64_t frames_out = 0;
  int links_in = 0;
  int links_out = 0;
  // Times a waiting thread went to sleep on its rings' waiter bells (it then
  // reads the rings itself when woken), and frames that the progress thread
  // handed on (what no waiting thread took).
  uint64_t waiter_sleeps = 0;
  uint64_t frames_by_drain = 0;
  // Body bytes sent through shm rings and over the proc connection.
  uint64_t shm_bytes_out = 0;
  uint64_t socket_bytes_out = 0;
};
ShmPathStats shm_path_stats();

}  // namespace castmesh::link
