// Endpoint: a proc's one transport endpoint. It listens on one channel
// address (its proc id), keeps one authenticated, multiplexed connection per
// peer proc, and moves FrameHeader + Payload frames between procs.
//
// Threading: every Endpoint owns one I/O thread (Asio io_context) that runs
// all socket work and calls the handlers. send() may be called from any
// thread, including from inside a handler. Handlers must not block.
//
// Ordering: frames sent to one peer leave in the order send() returned, over
// one connection, and each carries a per-connection sequence number that the
// receiver checks; so delivery is FIFO per (sender proc, receiver proc) and
// therefore per sender-receiver actor pair.
//
// Coalescing: send() appends the frame to the peer's outbound queue and, if
// no flush is pending, schedules one on the I/O thread; a flush writes
// everything queued by then in one gather write (small frames share one
// buffer, payloads above kInlinePayloadLimit go out from their own buffer).
// Exception for latency: a frame sent on an idle connection more than ~10 us
// after the previous one, or sent with SendUrgency::kNow, is written at once
// by the sending thread, a large payload included (one non-blocking gather
// write; whatever does not fit goes the normal way): a lone frame costs no
// I/O thread wake-up, which on a VM costs tens of microseconds. The queue
// is the only record of what is left to write, and one writer at a time
// writes its front without blocking: the sending thread or a PeerReader's
// thread (push()) under the queue's lock, or the I/O thread, which takes
// the chunks out, writes them without the lock (so senders never wait on
// its system calls) and puts back what the socket did not take.
//
// Backpressure: each peer's outbound queue is bounded by
// EndpointOptions::max_outbound_bytes (bytes queued or being written). A
// send() that would exceed it when the queue is not empty blocks the calling
// thread until the queue drains below the bound, for at most
// send_block_timeout, then fails with ResourceExhausted. On the I/O thread
// (inside a handler) send() never blocks: over the bound it fails with
// ResourceExhausted at once. Nothing is dropped silently: a frame is either
// queued (send returns OK) or refused (send returns an error). Frames queued
// to a peer whose connection is lost are dropped and the loss is reported
// through the PeerLostHandler.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "castmesh/wire/v1/frame.pb.h"
#include "core/transport/tls.h"
#include "core/wire/frame.h"
#include "core/wire/payload.h"

namespace castmesh::transport {

// Payloads up to this size are copied into the coalesced write buffer;
// larger ones are written straight from their own memory.
inline constexpr std::size_t kInlinePayloadLimit = 16 * 1024;

// How often an idle connection sends a heartbeat, and after how long
// without any frame its peer is declared lost. Plain value.
struct HeartbeatSettings {
  absl::Duration interval = absl::Milliseconds(500);
  absl::Duration timeout = absl::Seconds(5);
};

// Configuration of an Endpoint; plain value.
struct EndpointOptions {
  // Channel URL to listen on (local:, unix:, tcp:). Empty: no listener; the
  // endpoint then has an "anon:..." id and is reachable only over the
  // connections it opens. tcp port 0 picks a free port (see Endpoint::id()).
  std::string listen;
  // tcp: the host written into id() instead of the listen host, for a
  // listener on a wildcard address (tcp:0.0.0.0:PORT, tcp:[::]:PORT) whose
  // peers must dial a routable name or address. Empty: the listen host.
  std::string advertise_host;
  // Mesh secret shared by every proc of the mesh; must not be empty.
  std::string secret;
  // Mutual TLS 1.3 on every TCP connection, accepted or dialed (all three
  // files set), or none (all empty). With TLS, both sides verify the other's
  // certificate against the CA before any castmesh frame is read, then run
  // the secret handshake inside TLS. Every byte of a TLS connection goes
  // through its TLS session: it is read by the I/O thread only (it lends
  // no PeerReader), and direct writes by sending threads are TLS writes.
  // Unix sockets and local: channels never use TLS.
  TlsFiles tls;
  wire::FrameLimits limits;
  std::size_t max_outbound_bytes = std::size_t{256} << 20;
  absl::Duration send_block_timeout = absl::Seconds(30);
  // An unauthenticated connection is closed after this long; under pressure
  // (more than half of max_unauthenticated in use, or descriptors ran out
  // in the last 10 s) new ones get a fifth of it (at least 200 ms).
  absl::Duration handshake_timeout = absl::Seconds(5);
  // At most this many accepted connections may be in their handshake at
  // once, and at most max_unauthenticated_per_peer of them from one peer
  // (one process for Unix sockets, one IP address for TCP; where the system
  // does not tell a Unix peer's pid, all Unix peers count as one); a connection
  // beyond either is closed as soon as it is accepted (docs/security.md).
  std::size_t max_unauthenticated = 512;
  std::size_t max_unauthenticated_per_peer = 64;
  // An idle connection sends a heartbeat this often; a peer from which
  // nothing arrived for heartbeat_timeout is declared lost.
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // Announce, read and send binary data frames (wire/v1/frame.proto), which
  // skip protobuf for data frames between two procs that both do. Off:
  // speak as a proc without them (tests of mixed versions).
  bool binary_data_frames = true;
  // After the I/O thread delivered frames of a plaintext connection and a
  // handler answered one of them on the I/O thread, it looks at the socket
  // for the next frame this long (progress/wait_policy.h: pausing, or
  // yielding where the core is wanted) before it sleeps in the reactor: a
  // request/reply exchange driven by handlers then costs no reactor wake-up
  // per frame where cores are free. Not while waiting callers read
  // connections themselves (PeerReader::defer_io_thread). Zero (the
  // default): sleep at once; on a loaded machine a spinning thread loses the
  // scheduler's wake-up preference and the spin measured slower
  // (bench/RESULTS.md, "Latency (issue 37, C++ paths)").
  absl::Duration read_spin = absl::ZeroDuration();
};

// Called on the I/O thread for every KIND_MESSAGE / KIND_CONTROL frame header
// that is not a data frame, with the peer's proc id.
using MessageHandler =
    std::function<void(const std::string& peer, wire::v1::FrameHeader&& frame_header, wire::Payload payload)>;
// Called for every data frame (Endpoint::send_data) on the I/O thread, or
// on a PeerReader's thread for the types its filter accepts: its type, the
// sender's header bytes (valid for the call) and the raw payload.
using DataHandler = std::function<void(const std::string& peer, std::string_view type, std::string_view header,
                                       wire::Payload payload)>;
// Called on the I/O thread when the connection to `peer` is lost (closed,
// reset, heartbeat timeout, protocol error) or could not be opened. Not
// called while the endpoint is being destroyed.
using PeerLostHandler = std::function<void(const std::string& peer, const absl::Status& why)>;

// Receives one large payload where its receiver wants it (e.g. straight into
// a user's buffer) instead of in a buffer of its own. Used on the I/O thread
// only, one call at a time.
class PayloadSink {
 public:
  virtual ~PayloadSink() = default;
  // Places up to `n` bytes at offset `offset` of the payload: calls
  // `take(into, max)` with memory for at most `max <= n` bytes, which fills
  // some of it from the connection and returns how many (0: none were
  // ready). Returns what `take` returned. A sink may hold its own lock
  // around `take`: it never blocks.
  virtual size_t receive(size_t offset, size_t n, const std::function<size_t(char* into, size_t max)>& take) = 0;
  // The payload is over: every byte arrived (`complete`), or the connection
  // was lost first.
  virtual void finish(bool complete) = 0;
};
// Asked on the I/O thread (or a PeerReader's, for a frame it takes) for an
// authenticated data frame whose payload (`size` bytes) is not yet
// buffered: a sink for its payload, or nullptr (the payload then arrives in
// its own buffer, through the DataHandler). A sink's frame is not passed to
// the DataHandler.
using PayloadSinkProvider = std::function<std::shared_ptr<PayloadSink>(
    const std::string& peer, std::string_view type, std::string_view header, uint64_t size)>;
// Where an endpoint's data frames go.
struct DataHandlers {
  DataHandler deliver;       // empty: data frames are dropped
  PayloadSinkProvider sinks;  // empty: every payload arrives in its own buffer
};

// How send() writes a small frame on an idle connection.
enum class SendUrgency { kCoalesce, kNow };

// Which data frames, by type, a PeerReader's thread may deliver itself
// (those whose handlers may run off the I/O thread). Every other frame is
// the I/O thread's.
using FrameFilter = std::function<bool(std::string_view data_type)>;

// Lets a thread other than the I/O thread read one connection while it
// waits for a frame from that peer (collectives: the waiting caller reads
// its socket itself, instead of the I/O thread waking to read it and then
// waking the caller). The reader and the I/O thread take turns on the
// connection's read buffer: every frame is delivered once, in order, by
// whichever thread read it; a reader delivers only the frames its filter
// accepts (reading a large payload straight into its destination as it
// comes, taking turns with the I/O thread), and leaves the first other one,
// and what follows it until the I/O thread has read it, to the I/O thread.
// Handlers of accepted frames run on the reading thread, inside pump(), and
// a payload that was buffered with its frame is borrowed from the read
// buffer (wire::Payload::borrow): a handler that keeps it takes owned().
// Use a reader only while its Endpoint lives. Thread-safe.
class PeerReader {
 public:
  // What pump() did.
  enum class Pumped {
    kDelivered,  // delivered at least one frame
    kNothing,    // the socket had no complete frame for this reader
    kBusy,       // another thread reads the connection now (or this is the I/O thread)
    kGone,       // the connection closed: ask for a reader again
  };
  virtual ~PeerReader() = default;
  // A descriptor of the connection's socket, for poll() (POLLIN); valid as
  // long as the reader.
  virtual int fd() const = 0;
  // Reads what the socket holds, without blocking, and delivers the
  // complete frames the filter accepts, on this thread.
  virtual Pumped pump() = 0;
  // Writes, without blocking, what the connection has queued for the peer
  // and the I/O thread has yet to write (the rest of a large send that
  // filled the socket), on this thread. True when it wrote something.
  virtual bool push() = 0;
  // For a reader whose thread is about to busy-wait on the connection: the
  // endpoint's I/O thread stops preempting a running thread when a frame
  // wakes it (platform::set_calling_thread_defers_on_wake), until no
  // reader has asked for a whole heartbeat interval. On a host whose cores
  // all run busy-waiting callers, the I/O thread woken by the frame a
  // caller is about to read itself would otherwise take a core from one of
  // them. Cheap when repeated (two atomics). Any thread.
  virtual void defer_io_thread() = 0;
};

class Endpoint {
 public:
  // Binds the listener (if any), starts the I/O thread and returns the
  // endpoint. Errors: bad address, address in use, empty secret.
  static absl::StatusOr<std::unique_ptr<Endpoint>> start(EndpointOptions options,
                                                         MessageHandler on_message,
                                                         PeerLostHandler on_peer_lost = {},
                                                         DataHandlers data = {});
  // Closes every connection and the listener, joins the I/O thread. Do not
  // destroy an endpoint from inside one of its own handlers.
  ~Endpoint();
  // What the destructor does, without destroying the object: afterwards no
  // handler runs and send() fails. Idempotent. Not from a handler.
  void shutdown();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // This proc's id: the canonical URL it listens on (with the actual port
  // for tcp port 0), or "anon:<pid>-<random>" without a listener.
  const std::string& id() const;

  // Queues `frame_header` (+ `payload`) for the proc `peer` (its id / address),
  // opening and authenticating a connection first if there is none. Fills in
  // version, sequence and payload_size. OK means queued, not delivered; a
  // connection that fails later is reported through the PeerLostHandler.
  // Sending to id() delivers to this endpoint's own handler.
  // `urgency` kNow: the sender waits for an answer, so a frame that finds
  // the connection idle is written by the calling thread at once
  // however soon it follows the previous one (kCoalesce: only after a gap;
  // see "Coalescing" above).
  absl::Status send(std::string_view peer, wire::v1::FrameHeader frame_header, wire::Payload payload = {},
                    SendUrgency urgency = SendUrgency::kCoalesce);

  // Queues a data frame for `peer`: a message of `type` (a service's name
  // for its messages) made of a small `header` (the service's own encoding,
  // at most a few KiB) and `payload`, the raw body, written from its own
  // buffer when large. Delivered to the peer's DataHandler, in order with
  // every other frame to `peer`; otherwise as send(). Any thread.
  absl::Status send_data(std::string_view peer, std::string_view type, std::string_view header,
                         wire::Payload payload = {}, SendUrgency urgency = SendUrgency::kNow);

  // Closes the connection to `peer` (if any) without reporting it lost.
  void disconnect(std::string_view peer);
  // Gives the connection to `peer` (present or future) its own heartbeat
  // instead of the options' (e.g. a HostMesh's settings for its hosts and
  // procs). The timer then ticks at the shortest interval in use. Any thread.
  void set_peer_heartbeat(std::string_view peer, HeartbeatSettings heartbeat);

  // The process id of `peer` as the kernel reports it for its authenticated
  // Unix-socket connection (SO_PEERCRED), or nullopt (no connection now, TCP,
  // or a system that does not tell). Any thread.
  std::optional<long> peer_pid(std::string_view peer) const;

  // Proc ids of the peers with an authenticated connection now.
  std::vector<std::string> peers() const;

  // True on this endpoint's I/O thread.
  bool on_io_thread() const;

  // From inside a MessageHandler or DataHandler (on whatever thread delivers): a reader
  // of the connection that delivered the current frame, with filter `mine`;
  // nullptr outside a handler or when the system cannot lend one.
  static std::shared_ptr<PeerReader> delivering_reader(FrameFilter mine);

  // From inside a MessageHandler or DataHandler: true when the frame being
  // delivered has others behind it (more bytes in its connection's read
  // buffer, or this read turn of the connection already delivered 16
  // frames). A receiver then hands the frame's work to another thread
  // rather than run it on the delivering one, so the I/O thread gets back
  // to the rest. False outside a handler.
  static bool delivering_followed();

  // Runs `fn` on the I/O thread (after what is already queued there).
  void post(std::function<void()> fn);

  class Impl;

 private:
  explicit Endpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace castmesh::transport
