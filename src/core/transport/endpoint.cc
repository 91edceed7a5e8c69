#include "core/transport/endpoint.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <asio/connect.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/generic/stream_protocol.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"
#include "core/log/log.h"
#include "core/platform/platform.h"
#include "core/platform/process.h"
#include "core/progress/wait_policy.h"
#include "core/transport/address.h"
#include "core/transport/unix_socket_names.h"
#include "core/wire/handshake.h"

namespace castmesh::transport {
namespace {

using Socket = asio::generic::stream_protocol::socket;
using GenericEndpoint = asio::generic::stream_protocol::endpoint;
using Clock = std::chrono::steady_clock;

// The time of the latest bytes from a peer (last_rx_), which only the
// heartbeat timeout (seconds) reads: a coarse clock, at most a few
// milliseconds behind, costs a fraction of a precise read, and every
// received frame takes one. On Linux steady_clock is CLOCK_MONOTONIC, of
// which CLOCK_MONOTONIC_COARSE is the tick-granular reading.
Clock::time_point receive_time() {
#if CASTMESH_LINUX_FACILITIES
  timespec ts{};
  if (::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) == 0) {
    return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(ts.tv_sec) +
                                                                         std::chrono::nanoseconds(ts.tv_nsec)));
  }
#endif
  return Clock::now();
}
namespace v1 = wire::v1;

// Bytes read per read(): small frames are parsed out of this buffer; a large
// payload is read straight into its own buffer after at most this much of it
// has been copied from here.
constexpr std::size_t kReadBufferSize = 64 * 1024;
// A large payload is read into its final buffer at most this much per read,
// so a slow multi-GiB transfer counts as traffic (heartbeat) as it goes.
constexpr std::size_t kPayloadChunk = std::size_t{8} << 20;
// Out of descriptors, at most this many pending connections are accepted and
// closed at once (through the reserve descriptor) before accepting pauses.
constexpr int kRefusedPerRound = 256;
// A frame sent at least this long after the previous one on an idle
// connection is written at once by the sending thread (latency); frames that
// follow each other faster are coalesced by the I/O thread (throughput).
constexpr auto kDirectWriteGap = std::chrono::microseconds(10);
// Room a fresh queue chunk reserves for a frame header (they are tens of
// bytes; a larger one grows the chunk once more).
constexpr std::size_t kFrameHeaderReserve = 256;
// Largest frame buffer a connection keeps for reuse (recycle_locked).
constexpr std::size_t kMaxSpareChunkBytes = 64 * 1024;
// After this many frames delivered in one read turn of a connection, every
// further frame of that turn counts as followed by others
// (Endpoint::delivering_followed): a busy connection's receivers hand work
// on instead of running it on the reading thread, so the I/O thread gets
// back to its other connections.
constexpr std::uint32_t kQuietDrainFrames = 16;
// send() to a closed peer must not raise SIGPIPE. MSG_NOSIGNAL is POSIX
// (2008) and on Linux and the BSDs; where it is missing (older macOS) Asio
// sets SO_NOSIGPIPE on every socket it opens or accepts instead.
#if defined(MSG_NOSIGNAL)
constexpr int kNoSigPipe = MSG_NOSIGNAL;
#elif defined(SO_NOSIGPIPE)
constexpr int kNoSigPipe = 0;
#else
#error "this system has neither MSG_NOSIGNAL nor SO_NOSIGPIPE: castmesh cannot keep SIGPIPE from ending the process"
#endif

absl::Status lost(const std::string& what, const std::error_code& ec) {
  if (ec == asio::error::eof) return absl::UnavailableError(absl::StrCat(what, ": peer closed the connection"));
  return absl::UnavailableError(absl::StrCat(what, ": ", ec.message()));
}

// "unix peer pid 123" / "tcp 127.0.0.1:5555": who is on the other end, for logs.
std::string describe_remote(int fd) {
  sockaddr_storage storage{};
  socklen_t size = sizeof(storage);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&storage), &size) != 0) return "unknown peer";
  if (storage.ss_family == AF_UNIX) {
    if (std::optional<long> pid = unix_peer_pid(fd)) return absl::StrCat("unix peer pid ", *pid);
    return "unix peer";
  }
  if (storage.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
    asio::ip::address_v4 a(ntohl(in->sin_addr.s_addr));
    return absl::StrCat("tcp ", a.to_string(), ":", ntohs(in->sin_port));
  }
  if (storage.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    asio::ip::address_v6::bytes_type bytes;
    std::memcpy(bytes.data(), &in6->sin6_addr, 16);
    return absl::StrCat("tcp [", asio::ip::address_v6(bytes).to_string(), "]:", ntohs(in6->sin6_port));
  }
  return "peer";
}

// Whom the caps on unauthenticated connections count against: the process
// on the other end of a Unix socket (all Unix peers together where the
// system does not tell the pid), the IP address of a TCP peer.
std::string admission_key(int fd) {
  sockaddr_storage storage{};
  socklen_t size = sizeof(storage);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&storage), &size) != 0) return "unknown";
  if (storage.ss_family == AF_UNIX) {
    if (std::optional<long> pid = unix_peer_pid(fd)) return absl::StrCat("unix pid ", *pid);
    return "unix";
  }
  const std::string remote = describe_remote(fd);  // "tcp ADDRESS:PORT"
  const auto colon = remote.rfind(':');
  return colon == std::string::npos ? remote : remote.substr(0, colon);
}

// A descriptor held in reserve: closed to accept (and refuse) pending
// connections when the process is out of descriptors, then taken again.
int open_reserve_descriptor() { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); }

void set_no_delay(Socket& socket) {
  const int family = socket.local_endpoint().protocol().family();
  if (family == AF_INET || family == AF_INET6) {
    int one = 1;
    ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
}

// Resolves a unix: or tcp: address to a socket endpoint (blocking for tcp
// host names; literals resolve at once).
absl::StatusOr<GenericEndpoint> to_socket_endpoint(const ChannelAddress& address, asio::io_context& io) {
  if (address.kind == ChannelAddress::Kind::kUnix) {
    if (address.abstract && !abstract_unix_sockets_supported()) {
      return absl::UnavailableError(absl::StrCat("cannot reach ", address.to_string(),
                                                 ": abstract Unix socket names exist only on Linux"));
    }
    std::string path = address.abstract ? std::string(1, '\0') + address.name : address.name;
    return GenericEndpoint(asio::local::stream_protocol::endpoint(path));
  }
  if (address.kind == ChannelAddress::Kind::kTcp) {
    std::error_code ec;
    asio::ip::address ip = asio::ip::make_address(address.host, ec);
    if (!ec) return GenericEndpoint(asio::ip::tcp::endpoint(ip, address.port));
    asio::ip::tcp::resolver resolver(io);
    auto results = resolver.resolve(address.host, std::to_string(address.port), ec);
    if (ec || results.empty()) {
      return absl::UnavailableError(absl::StrCat("cannot resolve host '", address.host, "': ", ec.message()));
    }
    return GenericEndpoint(results.begin()->endpoint());
  }
  return absl::InvalidArgumentError("local: addresses have no socket");
}

// Endpoints listening on local:NAME, by name. Process-wide.
struct LocalRegistry {
  detail::Mutex mu;
  absl::flat_hash_map<std::string, Endpoint::Impl*> by_name ABSL_GUARDED_BY(mu);
};
LocalRegistry& local_registry() {
  static auto* registry = new LocalRegistry;  // never destroyed: used from exit paths
  return *registry;
}

}  // namespace

class Connection;

// What one send() or send_data() queues: a message's frame header, or a
// data frame's type and header (borrowed for the call).
struct Outgoing {
  explicit Outgoing(v1::FrameHeader* frame_header) : message(frame_header) {}
  Outgoing(std::string_view type, std::string_view header) : data_type(type), data_header(header) {}
  v1::FrameHeader* message = nullptr;
  std::string_view data_type;
  std::string_view data_header;
};

class Endpoint::Impl {
 public:
  Impl(EndpointOptions options, MessageHandler on_message, PeerLostHandler on_peer_lost, DataHandlers data)
      : options_(std::move(options)),
        on_message_(std::move(on_message)),
        on_peer_lost_(std::move(on_peer_lost)),
        data_(std::move(data)),
        heartbeat_timer_(io_),
        accept_timer_(io_) {}
  ~Impl() { shutdown(); }

  absl::Status start();
  void shutdown();
  absl::Status send(std::string_view peer, Outgoing out, wire::Payload payload, SendUrgency urgency);
  void disconnect(std::string_view peer);
  void set_peer_heartbeat(std::string_view peer, HeartbeatSettings heartbeat);
  std::vector<std::string> peers() const;
  std::optional<long> peer_pid(std::string_view peer) const;
  bool on_io_thread() const { return io_.get_executor().running_in_this_thread(); }
  void post(std::function<void()> fn) { asio::post(io_, std::move(fn)); }
  // Whether waiting callers read connections themselves now (see
  // PeerReader::defer_io_thread()). Any thread.
  bool io_thread_defers() const { return io_thread_defers_.load(std::memory_order_acquire); }
  // Frames sent by handlers on the I/O thread so far. I/O thread only.
  std::uint64_t io_thread_sends() const { return io_thread_sends_; }

  // See PeerReader::defer_io_thread(). Any thread.
  void defer_io_thread() {
    last_deferral_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    if (io_thread_defers_.exchange(true, std::memory_order_acq_rel)) return;
    post([] { (void)platform::set_calling_thread_defers_on_wake(true); });
  }
  // I/O thread, each heartbeat tick: preempting again once no reader asked
  // for a whole heartbeat interval. A request racing with this only goes
  // unserved until the next one, which finds the flag down and posts.
  void end_idle_deferral(Clock::time_point now) {
    if (!io_thread_defers_.load(std::memory_order_acquire)) return;
    const Clock::time_point last{Clock::duration{last_deferral_.load(std::memory_order_relaxed)}};
    if (now - last < absl::ToChronoNanoseconds(options_.heartbeat_interval)) return;
    io_thread_defers_.store(false, std::memory_order_release);
    (void)platform::set_calling_thread_defers_on_wake(false);
  }

  // Called by connections, on the I/O thread.
  void on_established(const std::shared_ptr<Connection>& connection);
  // I/O thread: the handshake deadline of a connection accepted now.
  absl::Duration handshake_deadline() const;
  void on_closed(const std::shared_ptr<Connection>& connection, const absl::Status& why, bool report);
  void deliver(const std::string& peer, v1::FrameHeader&& frame_header, wire::Payload payload);
  void deliver_data(const std::string& peer, std::string_view type, std::string_view header, wire::Payload payload);
  // The receiver's sink for a data frame's payload not yet buffered, or nullptr.
  std::shared_ptr<PayloadSink> payload_sink(const std::string& peer, std::string_view type, std::string_view header,
                                            uint64_t size) {
    if (stopping() || !data_.sinks) return nullptr;
    return data_.sinks(peer, type, header, size);
  }

  const EndpointOptions& options() const { return options_; }
  // The credentials for TLS connections; null without TLS.
  TlsContext* tls() const { return tls_.get(); }
  // Whether connections accepted by the listener speak TLS (a TCP listener
  // of an endpoint with TLS).
  bool accepts_tls() const { return tls_ != nullptr && tcp_listener_; }
  asio::io_context& io() { return io_; }
  const std::string& id() const { return id_; }
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }

 private:
  absl::Status listen(const ChannelAddress& address);
  void accept_next();
  void on_accept_error(const std::error_code& ec);
  void refuse_pending();
  void admit(Socket socket);
  void release_admission(Connection& connection);
  void arm_heartbeat();
  absl::Status send_in_process(std::string_view peer, Outgoing out, wire::Payload payload);

  EndpointOptions options_;
  MessageHandler on_message_;
  PeerLostHandler on_peer_lost_;
  DataHandlers data_;
  std::string id_;
  std::string local_name_;       // registered local: name, if any
  std::string unix_path_;        // filesystem socket to unlink at shutdown, if any
  std::shared_ptr<TlsContext> tls_;  // set by start(), before any connection
  bool tcp_listener_ = false;        // set by start(), before any connection

  mutable asio::io_context io_{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::optional<asio::basic_socket_acceptor<asio::generic::stream_protocol>> acceptor_;
  asio::steady_timer heartbeat_timer_;
  asio::steady_timer accept_timer_;  // accepting again after a failed accept
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> io_thread_defers_{false};  // the I/O thread defers on wake (or is about to)
  std::uint64_t io_thread_sends_ = 0;            // frames sent on the I/O thread (I/O thread only)
  std::atomic<Clock::rep> last_deferral_{0};     // when a reader last asked it to

  mutable detail::Mutex peers_mu_;
  // The connection used to send to each peer (one per peer proc).
  absl::flat_hash_map<std::string, std::shared_ptr<Connection>> peers_ ABSL_GUARDED_BY(peers_mu_);
  // Every open connection, including not yet authenticated ones.
  absl::flat_hash_set<std::shared_ptr<Connection>> connections_ ABSL_GUARDED_BY(peers_mu_);
  // Heartbeats of the peers that have their own (set_peer_heartbeat); the
  // timer ticks at the shortest interval of these and the options'.
  absl::flat_hash_map<std::string, HeartbeatSettings> peer_heartbeats_ ABSL_GUARDED_BY(peers_mu_);
  absl::Duration tick_interval_ ABSL_GUARDED_BY(peers_mu_) = absl::ZeroDuration();

  // Admission of accepted connections (I/O thread only).
  std::size_t unauthenticated_ = 0;
  absl::flat_hash_map<std::string, std::size_t> unauthenticated_by_peer_;
  std::chrono::milliseconds accept_backoff_{0};
  Clock::time_point out_of_descriptors_until_{};  // "under pressure" until then
  int reserve_fd_ = -1;
};

// One socket to one peer proc. Reading, handshaking and closing happen on the
// owner's I/O thread; enqueue() may be called from any thread and is guarded
// by out_mu_.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Endpoint::Impl& owner, bool outgoing, std::string peer)
      : owner_(owner),
        socket_(owner.io()),
        handshake_timer_(owner.io()),
        outgoing_(outgoing),
        peer_(std::move(peer)),
        rbuf_(new char[std::max<std::size_t>(kReadBufferSize,
                                             owner.options().limits.max_body_size + 64)]),
        rcap_(std::max<std::size_t>(kReadBufferSize, owner.options().limits.max_body_size + 64)) {}
  ~Connection() {
    if (reader_fd_ >= 0) ::close(reader_fd_);
  }

  Socket& socket() { return socket_; }
  const std::string& peer() const { return peer_; }
  bool established() const { return established_.load(std::memory_order_acquire); }
  const std::string& remote() const { return remote_; }
  // The peer process's pid as the kernel tells it (Unix sockets), or -1.
  long peer_pid() const { return peer_pid_.load(std::memory_order_acquire); }
  // Linux answers SO_PEERCRED on a TCP socket too, with pid 0: only a real
  // pid counts.
  void record_peer_pid() {
    const long pid = unix_peer_pid(socket_.native_handle()).value_or(-1);
    peer_pid_.store(pid > 0 ? pid : -1, std::memory_order_release);
  }

  // I/O thread: an accepted socket, counted against `admission_key`'s caps
  // until it authenticates or closes; sends the challenge.
  void start_accepted(std::string admission_key, absl::Duration deadline) {
    admission_key_ = std::move(admission_key);
    admitted_ = true;
    remote_ = describe_remote(socket_.native_handle());
    record_peer_pid();
    set_no_delay(socket_);
    arm_handshake_timeout(deadline);
    if (owner_.accepts_tls()) {
      start_tls(/*server=*/true);  // the challenge follows the TLS handshake
      return;
    }
    send_challenge();
  }

  // I/O thread: the acceptor's first handshake step.
  void send_challenge() {
    my_nonce_ = wire::make_nonce();
    v1::Handshake hs;
    auto* challenge = hs.mutable_challenge();
    challenge->set_version(wire::kWireVersion);
    challenge->set_nonce(my_nonce_);
    challenge->set_proc(owner_.id());
    challenge->set_features(my_features());
    write_handshake(hs);
    pump_on_io();
  }

  // Admission bookkeeping of the owner (I/O thread): true once, when the
  // connection stops counting as unauthenticated.
  bool take_admission(std::string* key) {
    if (!admitted_) return false;
    admitted_ = false;
    *key = std::move(admission_key_);
    return true;
  }

  // I/O thread: connects to `address`; the acceptor speaks first.
  void start_dial(const ChannelAddress& address) {
    auto target = to_socket_endpoint(address, owner_.io());
    if (!target.ok()) {
      close(target.status(), true);
      return;
    }
    arm_handshake_timeout(owner_.options().handshake_timeout);
    const bool tls = address.kind == ChannelAddress::Kind::kTcp && owner_.tls() != nullptr;
    socket_.async_connect(*target, [self = shared_from_this(), tls](const std::error_code& ec) {
      if (self->closed_) return;
      if (ec) {
        self->close(lost(absl::StrCat("cannot connect to ", self->peer_), ec), true);
        return;
      }
      self->remote_ = describe_remote(self->socket_.native_handle());
      self->record_peer_pid();
      set_no_delay(self->socket_);
      if (tls) {
        self->start_tls(/*server=*/false);  // the acceptor's challenge comes inside TLS
        return;
      }
      self->my_nonce_ = wire::make_nonce();
      self->pump_on_io();
    });
  }

  // I/O thread: the TLS handshake over the connected socket, before any
  // castmesh byte; then the secret handshake inside it.
  void start_tls(bool server) {
    // OpenSSL reads and writes the descriptor itself (no MSG_DONTWAIT):
    // the socket must not block the I/O thread.
    std::error_code ec;
    socket_.non_blocking(true, ec);
    if (ec) {
      protocol_error(lost("TLS setup", ec));
      return;
    }
    absl::StatusOr<SSL*> ssl = owner_.tls()->new_ssl(socket_.native_handle(), server);
    if (!ssl.ok()) {
      protocol_error(ssl.status());
      return;
    }
    tls_ = std::make_unique<TlsSession>(*ssl);
    tls_step();
  }

  void tls_step() {
    if (closed_) return;
    const TlsSession::Step step = tls_->handshake();
    switch (step) {
      case TlsSession::Step::kDone:
        tls_done_ = true;
        CASTMESH_LOG_DEBUG("castmesh-proc {}: TLS with {} ({})", owner_.id(), outgoing_ ? peer_ : remote_,
                           tls_->describe());
        if (outgoing_) {
          my_nonce_ = wire::make_nonce();
          pump_on_io();
        } else {
          send_challenge();
        }
        return;
      case TlsSession::Step::kWantRead:
      case TlsSession::Step::kWantWrite: {
        const auto wait =
            step == TlsSession::Step::kWantWrite ? asio::socket_base::wait_write : asio::socket_base::wait_read;
        socket_.async_wait(wait, [self = shared_from_this()](const std::error_code& ec) {
          if (self->closed_ || ec == asio::error::operation_aborted) return;
          if (ec) {
            self->protocol_error(lost("TLS handshake", ec));
            return;
          }
          self->tls_step();
        });
        return;
      }
      case TlsSession::Step::kFailed:
        protocol_error(absl::UnauthenticatedError(
            absl::StrCat("TLS with ", outgoing_ ? peer_ : remote_, " refused: ", tls_->error())));
        return;
    }
  }

  // Any thread. See the backpressure policy in endpoint.h.
  absl::Status enqueue(const Outgoing& out, wire::Payload&& payload, bool on_io_thread,
                       SendUrgency urgency = SendUrgency::kCoalesce) {
    const EndpointOptions& options = owner_.options();
    detail::MutexLock lock(out_mu_);
    if (out_closed_) return absl::UnavailableError(absl::StrCat("connection to ", peer_, " is closed"));
    const std::size_t frame_bytes = payload.size() + 64;
    auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(out_mu_) {
      return out_closed_ || queued_bytes_ == 0 || queued_bytes_ + frame_bytes <= options.max_outbound_bytes;
    };
    if (!fits()) {
      if (on_io_thread ||
          !out_cv_.wait_for(lock, options.send_block_timeout, fits)) {
        return absl::ResourceExhaustedError(absl::StrCat("outbound queue to ", peer_, " is full (",
                                                         queued_bytes_, " bytes queued)"));
      }
      if (out_closed_) return absl::UnavailableError(absl::StrCat("connection to ", peer_, " is closed"));
    }
    if (pending_.empty() || !pending_.back().payload.empty()) pending_.emplace_back();
    Chunk& chunk = pending_.back();
    const std::size_t before = chunk.bytes.size();
    // A fresh chunk: one allocation for the frame header and an inline
    // payload, not one each; none while a recycled buffer is big enough.
    if (before == 0) {
      const std::size_t want = kFrameHeaderReserve + (payload.size() <= kInlinePayloadLimit ? payload.size() : 0);
      if (spare_bytes_.capacity() >= want) chunk.bytes = std::move(spare_bytes_);
      chunk.bytes.reserve(want);
    }
    append_head(out, payload.size(), chunk.bytes);
    std::size_t added = chunk.bytes.size() - before;
    if (payload.size() <= kInlinePayloadLimit) {
      chunk.bytes.append(payload.data(), payload.size());
      added += payload.size();
    } else {
      added += payload.size();
      chunk.payload = std::move(payload);
    }
    queued_bytes_ += added;
    const auto now = Clock::now();
    const bool sparse = urgency == SendUrgency::kNow || now - last_enqueue_ >= kDirectWriteGap;
    last_enqueue_ = now;
    if (writing_ || !can_write_) return absl::OkStatus();  // the flush in progress takes it
    // Idle and one chunk queued (a large payload included): one non-blocking
    // gather write from this thread, so that a lone frame costs no I/O
    // thread wake-up. What is left (the socket full, or an error, which the
    // I/O thread's write then sees) goes to a flush.
    WrittenChunks written;
    if (sparse && direct_fd_ >= 0 && write_queued_locked(direct_fd_, written) == Written::kAll) {
      lock.unlock();
      return absl::OkStatus();  // `written` (the caller's payload) is released unlocked
    }
    set_writing_locked(true);
    lock.unlock();
    asio::post(owner_.io(), [self = shared_from_this()] { self->flush(); });
    return absl::OkStatus();
  }

  // I/O thread. Idempotent. `report`: tell the owner's PeerLostHandler.
  void close(const absl::Status& why, bool report) {
    if (closed_) return;
    closed_ = true;
    read_closed_.store(true, std::memory_order_release);
    handshake_timer_.cancel();
    // A payload being read is failed by a later turn: close() may run inside
    // a drain that holds read_mu_ (a read error), and no reader holds it long.
    asio::post(owner_.io(), [self = shared_from_this()] {
      detail::MutexLock lock(self->read_mu_);
      self->fail_partial();
    });
    {
      // Under out_mu_ first, so no sending thread is inside a direct write
      // on this fd when it is closed (and possibly reused).
      detail::MutexLock lock(out_mu_);
      out_closed_ = true;
      direct_fd_ = -1;
      pending_.clear();
      queued_bytes_ = 0;
    }
    std::error_code ignored;
    socket_.shutdown(asio::socket_base::shutdown_both, ignored);
    socket_.close(ignored);
    out_cv_.notify_all();
    owner_.on_closed(shared_from_this(), why, report);
  }

  // I/O thread: heartbeat tick, with this peer's heartbeat settings.
  void tick(Clock::time_point now, const HeartbeatSettings& heartbeat) {
    if (closed_ || !established_) return;
    if (now - last_rx_.load(std::memory_order_relaxed) > absl::ToChronoNanoseconds(heartbeat.timeout)) {
      close(absl::UnavailableError(absl::StrCat("no frame from ", peer_, " for ",
                                                absl::FormatDuration(heartbeat.timeout), " (heartbeat timeout)")),
            true);
      return;
    }
    if (now - last_tx_ >= absl::ToChronoNanoseconds(heartbeat.interval)) {
      v1::FrameHeader frame;
      frame.set_kind(v1::FrameHeader::KIND_HEARTBEAT);
      (void)enqueue(Outgoing(&frame), {}, true);  // a full queue means traffic: no heartbeat needed
    }
  }

 private:
  struct Chunk {
    std::string bytes;      // one or more whole frames (small payloads inline)
    wire::Payload payload;  // a large payload following `bytes`, written from its own memory
    std::size_t payload_sent = 0;  // of `payload`, by a direct write
    std::size_t payload_left() const { return payload.size() - payload_sent; }
  };

  // Chunks written whole, released after out_mu_; usually one or two.
  using WrittenChunks = absl::InlinedVector<Chunk, 2>;

  enum class Written { kAll, kFull, kError };

  // Keeps the frame buffer of a chunk written whole for the next fresh chunk
  // (the common case: one small frame written at once, then another), so a
  // frame costs no allocation. Payloads are still released after out_mu_.
  void recycle_locked(WrittenChunks& written) ABSL_EXCLUSIVE_LOCKS_REQUIRED(out_mu_) {
    for (Chunk& chunk : written) {
      const std::size_t capacity = chunk.bytes.capacity();
      if (capacity <= kMaxSpareChunkBytes && capacity > spare_bytes_.capacity()) {
        chunk.bytes.clear();
        spare_bytes_ = std::move(chunk.bytes);
      }
    }
  }

  // Appends the next frame's length prefix and head to `bytes`. A data
  // frame goes in the binary form to a peer that reads it, else its head
  // is encoded from data_head_, whose fields keep their memory between
  // frames: no allocation per frame either way.
  void append_head(const Outgoing& out, std::uint64_t payload_size, std::string& bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(out_mu_) {
    if (out.message == nullptr && peer_reads_binary_) {
      wire::append_binary_data_frame(next_sequence_++, payload_size, out.data_type, out.data_header, bytes);
      return;
    }
    v1::FrameHeader& head = out.message != nullptr ? *out.message : data_head_;
    if (out.message == nullptr) {
      data_head_.set_kind(v1::FrameHeader::KIND_CONTROL);
      data_head_.set_flags(wire::kDataFrameFlag);
      data_head_.mutable_message_type()->assign(out.data_type.data(), out.data_type.size());
      data_head_.mutable_data_header()->assign(out.data_header.data(), out.data_header.size());
    }
    head.set_version(wire::kWireVersion);
    head.set_sequence(next_sequence_++);
    head.set_payload_size(payload_size);
    wire::append_frame_body(head, bytes);
  }

  // One non-blocking gather write of `head` (handshake bytes) then the
  // chunks of `queue`, in order (through TLS on a TLS connection): the
  // bytes written, 0 when the socket is full, or -errno.
  ssize_t send_front(int fd, const std::string& head, std::vector<Chunk>& queue) {
    constexpr int kMaxParts = 64;
    iovec iov[kMaxParts];
    int parts = 0;
    if (!head.empty()) iov[parts++] = iovec{const_cast<char*>(head.data()), head.size()};
    for (std::size_t i = 0; i < queue.size() && parts + 2 <= kMaxParts; ++i) {
      Chunk& chunk = queue[i];
      if (!chunk.bytes.empty()) iov[parts++] = iovec{chunk.bytes.data(), chunk.bytes.size()};
      if (chunk.payload_left() > 0) {
        iov[parts++] = iovec{const_cast<char*>(chunk.payload.data()) + chunk.payload_sent, chunk.payload_left()};
      }
    }
    if (tls_ != nullptr) {
      const ssize_t n = tls_->write(iov, parts);
      if (n >= 0) return n;
      return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -errno;
    }
    msghdr message{};
    message.msg_iov = iov;
    message.msg_iovlen = parts;
    const ssize_t n = ::sendmsg(fd, &message, MSG_DONTWAIT | kNoSigPipe);
    if (n >= 0) return n;
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -errno;
  }

  // Drops `n` written bytes from the front of `head` then `queue`; chunks
  // written whole move to `written`. Returns how many were `queue`'s (the
  // bytes counted in queued_bytes_).
  static std::size_t drop_front(std::size_t n, std::string& head, std::vector<Chunk>& queue,
                                WrittenChunks& written) {
    const std::size_t of_head = std::min(n, head.size());
    head.erase(0, of_head);
    n -= of_head;
    const std::size_t of_queue = n;
    std::size_t whole = 0;
    while (n > 0 && whole < queue.size()) {
      Chunk& chunk = queue[whole];
      const std::size_t of_bytes = std::min(n, chunk.bytes.size());
      chunk.bytes.erase(0, of_bytes);
      n -= of_bytes;
      const std::size_t of_payload = std::min(n, chunk.payload_left());
      chunk.payload_sent += of_payload;
      n -= of_payload;
      if (!chunk.bytes.empty() || chunk.payload_left() > 0) break;
      ++whole;
    }
    for (std::size_t i = 0; i < whole; ++i) written.push_back(std::move(queue[i]));
    queue.erase(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(whole));
    return of_queue;
  }

  // Writes the queue (handshake frames, then the pending chunks) from this
  // thread, holding out_mu_, until it is empty or the socket is full: a
  // sender finding the connection idle, or a waiting reader's thread while
  // the I/O thread waits for the socket (push_here). The I/O thread's flush
  // writes without out_mu_, from chunks it takes out of the queue and puts
  // back unwritten (io_writing_ meanwhile), so that senders are not held up
  // by its writes; no two writers ever interleave. Chunks written whole move
  // to `written`, to be released after out_mu_ (a payload's release may
  // call back into a sender).
  Written write_queued_locked(int fd, WrittenChunks& written) ABSL_EXCLUSIVE_LOCKS_REQUIRED(out_mu_) {
    while (!handshake_out_.empty() || !pending_.empty()) {
      const ssize_t n = send_front(fd, handshake_out_, pending_);
      if (n < 0) return Written::kError;
      if (n == 0) return Written::kFull;
      queued_bytes_ -= std::min(queued_bytes_, drop_front(static_cast<std::size_t>(n), handshake_out_, pending_, written));
      recycle_locked(written);
    }
    return Written::kAll;
  }

  void set_writing_locked(bool writing) ABSL_EXCLUSIVE_LOCKS_REQUIRED(out_mu_) {
    writing_ = writing;
    output_queued_.store(writing, std::memory_order_release);
  }

  void arm_handshake_timeout(absl::Duration deadline) {
    handshake_timer_.expires_after(absl::ToChronoNanoseconds(deadline));
    handshake_timer_.async_wait([self = shared_from_this(), deadline](const std::error_code& ec) {
      if (ec || self->closed_ || self->established_) return;
      // A TLS side waits for a ClientHello that a plaintext dialer never
      // sends; a plaintext dialer waits for a challenge a TLS acceptor never
      // sends: say so, it is the likely cause.
      const bool tls_wait = self->tls_ != nullptr && !self->tls_done_;
      self->protocol_error(absl::DeadlineExceededError(absl::StrCat(
          tls_wait ? "TLS handshake" : "handshake", " not completed within ", absl::FormatDuration(deadline),
          tls_wait ? " (does the peer use TLS with this mesh's CA?)"
          : self->owner_.tls() == nullptr && self->outgoing_ ? " (does the peer require TLS?)"
                                                              : "")));
    });
  }

  // --- writing (I/O thread) -------------------------------------------------

  // Handshake frames go out ahead of any frame header queued meanwhile.
  void write_handshake(const v1::Handshake& hs) {
    {
      detail::MutexLock lock(out_mu_);
      wire::append_frame_body(hs, handshake_out_);
      if (writing_) return;
      set_writing_locked(true);
    }
    flush_scheduled_now();
  }

  void flush_scheduled_now() { asio::post(owner_.io(), [self = shared_from_this()] { self->flush(); }); }

  // Runs with writing_ set: writes what is queued, without out_mu_, from
  // what it takes out of the queue; when the socket is full it puts the rest
  // back, waits until the socket is writable and writes again (a reader's
  // thread may write from the queue meanwhile: push_here).
  void flush() {
    for (;;) {
      if (closed_) return;
      std::string head;
      std::vector<Chunk> mine;
      {
        detail::MutexLock lock(out_mu_);
        head.swap(handshake_out_);
        if (can_write_) mine.swap(pending_);
        if (head.empty() && mine.empty()) {
          set_writing_locked(false);
          return;
        }
        io_writing_ = true;
      }
      WrittenChunks written;
      std::size_t counted = 0;
      ssize_t n = 1;
      while (n > 0 && (!head.empty() || !mine.empty())) {
        n = send_front(socket_.native_handle(), head, mine);
        if (n > 0) counted += drop_front(static_cast<std::size_t>(n), head, mine, written);
      }
      {
        detail::MutexLock lock(out_mu_);
        io_writing_ = false;
        queued_bytes_ -= std::min(queued_bytes_, counted);
        recycle_locked(written);
        handshake_out_.insert(0, head);  // the unwritten rest goes back in front
        if (!mine.empty()) {
          for (Chunk& chunk : pending_) mine.push_back(std::move(chunk));
          pending_.swap(mine);
        }
      }
      last_tx_ = Clock::now();
      after_write(written);
      if (n < 0) {
        close(lost(absl::StrCat("write to ", peer_), std::error_code(static_cast<int>(-n), std::system_category())),
              true);
        return;
      }
      if (n == 0) {
        wait_writable();
        return;
      }
    }
  }

  void wait_writable() {
    socket_.async_wait(asio::socket_base::wait_write, [self = shared_from_this()](const std::error_code& ec) {
      if (self->closed_ || ec == asio::error::operation_aborted) return;
      if (ec) {
        self->close(lost(absl::StrCat("write to ", self->peer_), ec), true);
        return;
      }
      self->flush();
    });
  }

  // After a write, out_mu_ released: frees what went out and wakes senders
  // waiting for queue space.
  void after_write(WrittenChunks& written) {
    written.clear();
    out_cv_.notify_all();
  }

  // Handshake done: frame headers may flow.
  void establish() {
    established_ = true;
    handshake_timer_.cancel();
    last_tx_ = Clock::now();
    last_rx_.store(last_tx_, std::memory_order_relaxed);
    // For PeerReaders: a descriptor that no close() of the socket can leave
    // dangling (or hand to another file) while a reader polls it.
    // A TLS connection lends no reader: its bytes are read through its TLS
    // session by the I/O thread only (a reader's raw recv() would bypass
    // it). Its senders' direct writes do go through the session
    // (send_front), whose lock serializes them with the I/O thread's reads.
    if (tls_ == nullptr) reader_fd_ = ::fcntl(socket_.native_handle(), F_DUPFD_CLOEXEC, 0);
    bool schedule = false;
    {
      detail::MutexLock lock(out_mu_);
      can_write_ = true;
      direct_fd_ = socket_.native_handle();
      if (!writing_ && !pending_.empty()) {
        set_writing_locked(true);
        schedule = true;
      }
    }
    if (schedule) flush_scheduled_now();
    owner_.on_established(shared_from_this());
  }

  // --- reading ----------------------------------------------------------------
  //
  // The read buffer and its parse state are shared by the I/O thread and a
  // PeerReader's thread (pump_here): whoever holds read_mu_ reads the socket
  // (until it has nothing more) and delivers the complete frames, in order.
  // Neither waits for read_mu_ while the other may be delivering: the I/O
  // thread flags io_pending_ and the holder hands the turn back by posting
  // pump_on_io() when it lets go. A payload larger than what came with its
  // frame header is read straight into its destination (partial_) by
  // whoever holds read_mu_ as its bytes come, a reader only when the frame
  // is one it takes: a waiting caller reads its own message whole, without
  // the I/O thread waking to read it and then waking the caller. Every frame
  // from the first one a reader does not take is the I/O thread's
  // (io_turn_).

 public:
  // The I/O thread's turn: reads and delivers what the socket has, then
  // waits for more. Bytes that arrive before the wait is armed raise no
  // event, so it looks once more after arming.
  void pump_on_io() {
    for (;;) {
      if (closed_) return;
      if (!read_mu_.try_lock()) {
        io_pending_.store(true, std::memory_order_seq_cst);
        if (!read_mu_.try_lock()) return;  // the holder posts pump_on_io() when it lets go
      }
      io_pending_.store(false, std::memory_order_relaxed);
      io_turn_.store(false, std::memory_order_release);
      const std::uint64_t before = expected_sequence_;
      const std::uint64_t sends_before = owner_.io_thread_sends();
      const Parsed parsed = drain(nullptr);
      // A handler answered on this thread: a request/reply exchange, whose
      // next frame is likely to come within the spin.
      const bool answered = expected_sequence_ != before && owner_.io_thread_sends() != sends_before;
      read_mu_.unlock();
      if (parsed == Parsed::kYield) {  // other connections' handlers run between large reads
        asio::post(owner_.io(), [self = shared_from_this()] { self->pump_on_io(); });
        return;
      }
      if (parsed != Parsed::kMore || closed_ || wait_armed_) return;
      if (answered && spin_for_next_frame()) continue;
      wait_armed_ = true;
      socket_.async_wait(asio::socket_base::wait_read, [self = shared_from_this()](const std::error_code& ec) {
        self->wait_armed_ = false;
        if (self->closed_ || ec == asio::error::operation_aborted) return;
        if (ec) {
          self->close(lost(absl::StrCat("connection to ", self->peer_), ec), true);
          return;
        }
        self->pump_on_io();
      });
    }
  }

  // I/O thread, after delivering frames that its handlers answered on this
  // thread: looks for the next one for EndpointOptions::read_spin before the
  // reactor wait (whose sleep and wake-up cost more than a reply's whole
  // trip on loopback). Frames handed to other threads (an actor's worker, a
  // waiting caller) do not start a spin: those threads need the core more
  // than this one, and their answer comes later than the spin. poll() looks
  // without the socket's lock (readable_now). True when bytes (or the
  // connection's end) came. A TLS connection has no reader_fd_ and does not
  // spin: its session may hold read-ahead bytes that poll() cannot see.
  bool spin_for_next_frame() {
    const absl::Duration budget = owner_.options().read_spin;
    if (budget <= absl::ZeroDuration() || reader_fd_ < 0 || owner_.io_thread_defers()) return false;
    struct Look {
      bool handled;
      bool busy;
    };
    bool ready = false;
    const absl::Time start = absl::Now();
    progress::spin(
        [&] {
          ready = readable_now();
          return Look{ready, false};
        },
        [&] { return ready || closed_; }, start, start + budget, /*oversubscribed_now=*/false);
    return ready && !closed_;
  }

  // A PeerReader's turn (any thread but the I/O thread).
  PeerReader::Pumped pump_here(const FrameFilter& mine) {
    if (read_closed_.load(std::memory_order_acquire) || reader_fd_ < 0) return PeerReader::Pumped::kGone;
    if (io_turn_.load(std::memory_order_acquire) || owner_.on_io_thread() || !read_mu_.try_lock()) {
      return PeerReader::Pumped::kBusy;
    }
    PeerReader::Pumped result = PeerReader::Pumped::kBusy;
    if (io_turn_.load(std::memory_order_acquire) || read_closed_.load(std::memory_order_acquire)) {
      // the I/O thread's turn after all
    } else if (!readable_now()) {
      // A reader's drain() ends with no complete frame it may take left in
      // the buffer, so a quiet socket means nothing to deliver.
      result = PeerReader::Pumped::kNothing;
    } else {
      const std::uint64_t before = expected_sequence_;
      const Parsed parsed = drain(&mine);
      result = parsed == Parsed::kClosed       ? PeerReader::Pumped::kGone
               : expected_sequence_ != before ? PeerReader::Pumped::kDelivered
               : parsed == Parsed::kMore      ? PeerReader::Pumped::kNothing
                                              : PeerReader::Pumped::kBusy;
    }
    read_mu_.unlock();
    if (io_pending_.exchange(false, std::memory_order_seq_cst) || io_turn_.load(std::memory_order_acquire)) {
      asio::post(owner_.io(), [self = shared_from_this()] { self->pump_on_io(); });
    }
    return result;
  }

  // Whether the socket has bytes (or news of its end) for a reader. poll()
  // asks without the socket's lock, which a recv() that finds nothing takes:
  // a reader spinning on recv() would hold off the peer's frame arriving.
  bool readable_now() const {
    pollfd p{reader_fd_, POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;
  }

  // A PeerReader's turn to write (any thread but the I/O thread): what the
  // connection has queued, while a flush is pending, without waiting for
  // the I/O thread to get a core. Errors are left to that flush. True when
  // it wrote something.
  bool push_here() {
    if (!output_queued_.load(std::memory_order_acquire) || owner_.on_io_thread()) return false;
    WrittenChunks written;
    bool wrote = false;
    {
      detail::MutexLock lock(out_mu_);
      if (!writing_ || io_writing_ || direct_fd_ < 0) return false;
      const std::size_t before = queued_bytes_ + handshake_out_.size();
      (void)write_queued_locked(direct_fd_, written);
      wrote = queued_bytes_ + handshake_out_.size() != before;
    }
    after_write(written);
    return wrote;
  }

  // The descriptor a PeerReader polls (a duplicate of the socket's, so it
  // stays valid however the connection closes), or -1.
  int reader_fd() const { return reader_fd_; }
  Endpoint::Impl& owner() { return owner_; }

 private:
  enum class Parsed {
    kMore,      // every complete frame delivered, the socket has nothing more
    kHandOver,  // a reader stopped at a frame for the I/O thread (io_turn_)
    kYield,     // the I/O thread read kPayloadChunk of a payload: its turn goes on later
    kClosed,    // the connection failed or closed
    kDone,      // (read_partial) the payload arrived and was delivered
  };

  // Reads the socket until it has nothing more, delivering complete frames
  // as they come. `mine`: nullptr on the I/O thread; a reader's filter else.
  Parsed drain(const FrameFilter* mine) ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_) {
    const int fd = mine == nullptr ? socket_.native_handle() : reader_fd_;
    drain_delivered_ = 0;
    std::size_t payload_bytes = 0;
    // A recv() that filled less than the room it had emptied the socket at
    // that instant, as an EAGAIN would say: the one after it is skipped.
    // On a spinning reader's critical path that one is a syscall taking the
    // socket's lock, which delays the peer's next frame into it.
    bool emptied = false;
    for (;;) {
      if (partial_.has_value()) {
        const Parsed parsed = read_partial(fd, mine, &payload_bytes);
        if (parsed != Parsed::kDone) return parsed;
        continue;
      }
      const Parsed parsed = parse_buffered(mine);
      if (parsed != Parsed::kMore) return parsed;
      if (partial_.has_value()) continue;
      if (emptied) return Parsed::kMore;
      if (rbegin_ == rend_) {
        rbegin_ = rend_ = 0;
      } else if (rbegin_ > 0 && rcap_ - rend_ < owner_.options().limits.max_body_size + 64) {
        std::memmove(rbuf_.get(), rbuf_.get() + rbegin_, rend_ - rbegin_);
        rend_ -= rbegin_;
        rbegin_ = 0;
      }
      const std::size_t room = rcap_ - rend_;
      bool drained = false;
      const ssize_t r = receive(fd, rbuf_.get() + rend_, room, &drained);
      if (r > 0) {
        rend_ += static_cast<std::size_t>(r);
        // TLS returns one record per read, however much more is ready: it
        // says itself whether its read-ahead emptied the socket.
        emptied = tls_ == nullptr ? static_cast<std::size_t>(r) < room : drained;
        last_rx_.store(receive_time(), std::memory_order_relaxed);
        continue;
      }
      const int error = r == 0 ? 0 : errno;
      if (r < 0 && (error == EAGAIN || error == EWOULDBLOCK)) return Parsed::kMore;
      if (r < 0 && error == EINTR) continue;
      recv_failed(mine, error);
      return Parsed::kClosed;
    }
  }

  // recv() of the socket, or through TLS on a TLS connection (the I/O
  // thread's alone there: a TLS connection lends no reader; `drained`: see
  // TlsSession::read).
  ssize_t receive(int fd, char* into, std::size_t max, bool* drained = nullptr) {
    if (tls_ != nullptr) return tls_->read(into, max, drained);
    return ::recv(fd, into, max, MSG_DONTWAIT);
  }

  // A recv() on the connection failed with `error` (errno), or found it
  // closed by the peer (`error` 0).
  void recv_failed(const FrameFilter* mine, int error) {
    if (error == 0 && outgoing_ && !established_ && acceptor_nonce_.empty() && owner_.tls() == nullptr) {
      // Closed before any challenge: a TLS acceptor closes a dialer that
      // never sent a TLS hello (at its handshake deadline).
      read_failed(mine,
                  absl::UnavailableError(absl::StrCat("connection to ", peer_,
                                                      ": the peer closed the connection before its challenge "
                                                      "(does the peer require TLS?)")),
                  /*protocol=*/false);
      return;
    }
    if (error == 0 && outgoing_ && !established_ && !acceptor_nonce_.empty()) {
      // Closed after this proc answered the challenge: the acceptor refused
      // the answer, most likely for a different mesh secret (a version
      // mismatch shows in the challenge, on this side; the acceptor's log
      // line says which). Unavailable, as any other close before the
      // connection is up (callers that retry a dial see the same code).
      read_failed(mine,
                  absl::UnavailableError(absl::StrCat(
                      "connection to ", peer_,
                      ": the peer closed the connection after this proc's proof of the mesh secret (is the "
                      "secret the same on both sides? the peer's log says why it refused)")),
                  /*protocol=*/false);
      return;
    }
    if (tls_ != nullptr && error == EPROTO) {
      read_failed(mine,
                  absl::UnavailableError(absl::StrCat("TLS connection with ", outgoing_ ? peer_ : remote_, ": ",
                                                      tls_->error())),
                  /*protocol=*/false);
      return;
    }
    const std::error_code ec =
        error == 0 ? asio::error::make_error_code(asio::error::eof) : std::error_code(error, std::generic_category());
    read_failed(mine,
                lost(established_ ? absl::StrCat("connection to ", peer_) : absl::StrCat("connection from ", remote_),
                     ec),
                /*protocol=*/false);
  }

  // The connection cannot be read on: closed now on the I/O thread, or by
  // the I/O thread soon (a reader never closes it itself).
  void read_failed(const FrameFilter* mine, const absl::Status& why, bool protocol) {
    if (mine == nullptr) {
      if (protocol) {
        protocol_error(why);
      } else {
        close(why, true);
      }
      return;
    }
    io_turn_.store(true, std::memory_order_release);
    asio::post(owner_.io(), [self = shared_from_this(), why, protocol] {
      if (self->closed_) return;
      if (protocol) {
        self->protocol_error(why);
      } else {
        self->close(why, true);
      }
    });
  }

  // Delivers the complete frames in the read buffer. A reader (`mine` set)
  // stops at the first frame whose payload is not all buffered or that
  // `mine` refuses (heartbeats it takes), leaving it to the I/O thread.
  Parsed parse_buffered(const FrameFilter* mine) ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_) {
    const wire::FrameLimits& limits = owner_.options().limits;
    for (;;) {
      if (mine == nullptr ? closed_ : read_closed_.load(std::memory_order_acquire)) return Parsed::kClosed;
      const std::size_t avail = rend_ - rbegin_;
      if (avail < wire::kLengthPrefixSize) return Parsed::kMore;
      if (!established_ && tls_ == nullptr && looks_like_tls(rbuf_.get() + rbegin_)) {
        read_failed(mine,
                    absl::FailedPreconditionError(absl::StrCat(
                        "the peer (", remote_, ") speaks TLS and this proc has no TLS configured (ca/cert/key)")),
                    /*protocol=*/true);
        return Parsed::kClosed;
      }
      const std::uint32_t prefix = wire::read_length_prefix(rbuf_.get() + rbegin_);
      const bool binary = established_ && (prefix & wire::kBinaryDataFrameBit) != 0;
      const std::uint32_t body_size = binary ? prefix & ~wire::kBinaryDataFrameBit : prefix;
      if (absl::Status st = wire::check_body_size(body_size, limits); !st.ok()) {
        read_failed(mine, st, /*protocol=*/true);
        return Parsed::kClosed;
      }
      if (avail < wire::kLengthPrefixSize + body_size) return Parsed::kMore;
      const char* body = rbuf_.get() + rbegin_ + wire::kLengthPrefixSize;
      if (!established_) {  // readers exist only once established
        rbegin_ += wire::kLengthPrefixSize + body_size;
        on_handshake_frame(body, body_size);
        continue;
      }
      absl::StatusOr<IncomingHead> head = binary ? binary_head(body, body_size) : parsed_head(body, body_size);
      if (!head.ok()) {
        read_failed(mine, head.status(), /*protocol=*/true);
        return Parsed::kClosed;
      }
      const std::uint64_t payload_size = head->payload_size;
      const std::size_t have = avail - wire::kLengthPrefixSize - body_size;
      if (!reader_takes(mine, *head)) {
        io_turn_.store(true, std::memory_order_release);
        return Parsed::kHandOver;
      }
      rbegin_ += wire::kLengthPrefixSize + body_size;
      if (payload_size <= have) {
        // A reader's handler runs here, before the buffer moves on: its
        // payload is borrowed from the buffer (PeerReader).
        const std::string_view bytes(rbuf_.get() + rbegin_, payload_size);
        wire::Payload payload = payload_size == 0 ? wire::Payload()
                                : mine != nullptr ? wire::Payload::borrow(bytes)
                                                  : wire::Payload::copy_of(bytes);
        rbegin_ += payload_size;
        if (!deliver(*head, std::move(payload), mine)) return Parsed::kClosed;
        continue;
      }
      return start_partial(*head, have, mine) ? Parsed::kMore : Parsed::kClosed;
    }
  }

  // The head of one incoming frame: a message or heartbeat (`message`), or
  // a data frame of either form, whose type and header it views (the read
  // buffer's bytes, or parsed_'s fields, or a PartialPayload's).
  struct IncomingHead {
    v1::FrameHeader* message = nullptr;  // not a data frame
    bool heartbeat = false;
    std::uint64_t sequence = 0;
    std::uint64_t payload_size = 0;
    std::string_view type, header;  // a data frame's
  };

  // A frame header, parsed into parsed_ (whose fields keep their memory
  // between frames).
  absl::StatusOr<IncomingHead> parsed_head(const char* body, std::size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_) {
    if (absl::Status st = wire::parse_frame_header_into(body, size, owner_.options().limits, parsed_); !st.ok()) {
      return st;
    }
    IncomingHead head;
    head.sequence = parsed_.sequence();
    head.payload_size = parsed_.payload_size();
    if (wire::is_data_frame(parsed_)) {
      head.type = parsed_.message_type();
      head.header = parsed_.data_header();
    } else {
      head.message = &parsed_;
      head.heartbeat = parsed_.kind() == v1::FrameHeader::KIND_HEARTBEAT;
    }
    return head;
  }

  // A binary data frame (frame.proto), which only a peer this proc offered
  // them to may send.
  absl::StatusOr<IncomingHead> binary_head(const char* body, std::size_t size) {
    if (!owner_.options().binary_data_frames) {
      return absl::InvalidArgumentError("a binary data frame, which this proc did not offer");
    }
    absl::StatusOr<wire::BinaryDataFrameHead> binary = wire::parse_binary_data_frame(body, size, owner_.options().limits);
    if (!binary.ok()) return binary.status();
    IncomingHead head;
    head.sequence = binary->sequence;
    head.payload_size = binary->payload_size;
    head.type = binary->type;
    head.header = binary->header;
    return head;
  }

  // The first bytes of a TLS handshake record (type 22, version 3.x), which
  // no castmesh handshake frame starts with (its length would be over 66 KB).
  static bool looks_like_tls(const char* bytes) { return bytes[0] == 0x16 && bytes[1] == 0x03; }

  // Whether the thread reading with filter `mine` (nullptr: the I/O thread)
  // delivers `head`'s frame: a reader takes heartbeats and the data frames
  // its filter accepts.
  static bool reader_takes(const FrameFilter* mine, const IncomingHead& head) {
    return mine == nullptr || head.heartbeat || (head.message == nullptr && (*mine)(head.type));
  }

  // A payload larger than what is buffered (all of the buffer is its start):
  // the rest is read straight into the receiver's memory (its sink), or
  // into a buffer of its own, by read_partial(). The size is the peer's
  // claim (bounded by limits.max_payload_size): memory that cannot be had
  // costs this connection, never the proc.
  bool start_partial(const IncomingHead& head, std::size_t have, const FrameFilter* mine)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_) {
    PartialPayload partial;
    partial.sequence = head.sequence;
    partial.payload_size = head.payload_size;
    if (head.message != nullptr) {
      partial.message = std::move(*head.message);
    } else {
      partial.data = true;
      partial.type.assign(head.type);
      partial.header.assign(head.header);
      if (head.sequence == expected_sequence_) {
        partial.sink = owner_.payload_sink(peer_, head.type, head.header, head.payload_size);
      }
    }
    if (partial.sink != nullptr) {
      if (!feed_buffered(*partial.sink, have)) {
        partial.sink->finish(false);
        read_failed(mine, absl::InternalError("a payload sink refused the bytes it was offered"), /*protocol=*/true);
        return false;
      }
    } else {
      absl::StatusOr<wire::Payload> payload = wire::Payload::try_allocate(head.payload_size, &partial.writable);
      if (!payload.ok()) {
        read_failed(mine, payload.status(), /*protocol=*/true);
        return false;
      }
      partial.payload = *std::move(payload);
      std::memcpy(partial.writable, rbuf_.get() + rbegin_, have);
      rbegin_ = rend_ = 0;
    }
    partial.got = have;
    partial_ = std::move(partial);
    return true;
  }

  // Reads the payload in progress as far as the socket has it, and delivers
  // it once whole (kDone). A reader leaves one it does not take to the I/O
  // thread; the I/O thread reads at most kPayloadChunk per turn (kYield).
  Parsed read_partial(int fd, const FrameFilter* mine, std::size_t* payload_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_) {
    PartialPayload& partial = *partial_;
    if (!reader_takes(mine, partial.head())) {
      io_turn_.store(true, std::memory_order_release);
      return Parsed::kHandOver;
    }
    const std::size_t size = partial.payload_size;
    while (partial.got < size) {
      if (mine == nullptr ? closed_ : read_closed_.load(std::memory_order_acquire)) return Parsed::kClosed;
      if (mine == nullptr && *payload_bytes >= kPayloadChunk) return Parsed::kYield;
      bool called = false;
      int error = 0;  // of a recv() that read nothing: errno, or 0 when the peer closed
      auto take = [&](char* into, std::size_t max) {
        called = true;
        const ssize_t r = receive(fd, into, max);
        if (r > 0) return static_cast<std::size_t>(r);
        error = r == 0 ? 0 : errno;
        return std::size_t{0};
      };
      const std::size_t want = std::min(size - partial.got, kPayloadChunk);
      const std::size_t n =
          partial.sink != nullptr ? partial.sink->receive(partial.got, want, take) : take(partial.writable + partial.got, want);
      if (n > 0) {
        partial.got += n;
        *payload_bytes += n;
        last_rx_.store(receive_time(), std::memory_order_relaxed);
        continue;
      }
      if (called && error == EINTR) continue;
      if (called && (error == EAGAIN || error == EWOULDBLOCK)) return Parsed::kMore;
      fail_partial();
      if (!called) {
        read_failed(mine, absl::InternalError("a payload sink refused the bytes it was offered"), /*protocol=*/true);
      } else {
        recv_failed(mine, error);
      }
      return Parsed::kClosed;
    }
    PartialPayload done = std::move(partial);
    partial_.reset();
    if (done.sink != nullptr) {
      ++expected_sequence_;  // the frame header, checked before its payload was read
      done.sink->finish(true);
      return Parsed::kDone;
    }
    return deliver(done.head(), std::move(done.payload), mine) ? Parsed::kDone : Parsed::kClosed;
  }

  // The connection is lost with a payload in progress: its sink learns it.
  void fail_partial() ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_) {
    if (partial_.has_value() && partial_->sink != nullptr) partial_->sink->finish(false);
    partial_.reset();
  }

  // Hands the payload bytes already in the read buffer (all of them belong
  // to the payload) to `sink`. False if the sink refused some (a sink must
  // take what is offered, into scratch memory if it wants none of it).
  bool feed_buffered(PayloadSink& sink, std::size_t have) ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_) {
    // Read under read_mu_ here: the analysis does not follow it into the lambda.
    const char* buffered = rbuf_.get() + rbegin_;
    std::size_t fed = 0;
    while (fed < have) {
      const std::size_t n = sink.receive(fed, have - fed, [&](char* into, std::size_t max) {
        std::memcpy(into, buffered + fed, max);
        return max;
      });
      if (n == 0) return false;
      fed += n;
    }
    rbegin_ = rend_ = 0;
    return true;
  }

  // Checks the frame's sequence number and hands it to the owner's handler
  // on this thread. False when the connection fails instead.
  bool deliver(const IncomingHead& head, wire::Payload payload, const FrameFilter* mine)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_) {
    if (head.sequence != expected_sequence_) {
      read_failed(mine,
                  absl::DataLossError(
                      absl::StrCat("sequence ", head.sequence, " where ", expected_sequence_, " was expected")),
                  /*protocol=*/true);
      return false;
    }
    ++expected_sequence_;
    if (head.heartbeat) return true;
    Connection* const saved = t_delivering;
    const bool saved_followed = t_followed;
    t_delivering = this;
    t_followed = rend_ > rbegin_ || ++drain_delivered_ > kQuietDrainFrames;
    if (head.message == nullptr) {
      owner_.deliver_data(peer_, head.type, head.header, std::move(payload));
    } else {
      owner_.deliver(peer_, std::move(*head.message), std::move(payload));
    }
    t_delivering = saved;
    t_followed = saved_followed;
    return true;
  }

 public:
  // The connection whose frame the calling thread is delivering, or nullptr.
  static Connection* delivering() { return t_delivering; }
  // See Endpoint::delivering_followed().
  static bool delivering_followed() { return t_delivering != nullptr && t_followed; }

 private:
  static thread_local Connection* t_delivering;
  static thread_local bool t_followed;  // the frame being delivered has others behind it

  void on_handshake_frame(const char* body, std::size_t size) {
    absl::StatusOr<v1::Handshake> hs = wire::parse_handshake(body, size);
    if (!hs.ok()) {
      protocol_error(hs.status());
      return;
    }
    const std::string& secret = owner_.options().secret;
    if (outgoing_ && hs->has_challenge() && acceptor_nonce_.empty()) {
      const v1::Challenge& challenge = hs->challenge();
      if (challenge.version() != wire::kWireVersion) {
        protocol_error(absl::FailedPreconditionError(absl::StrCat(
            "peer speaks wire version ", challenge.version(), ", this proc ", wire::kWireVersion)));
        return;
      }
      if (challenge.nonce().size() != wire::kNonceSize) {
        protocol_error(absl::InvalidArgumentError("challenge nonce has the wrong size"));
        return;
      }
      acceptor_nonce_ = challenge.nonce();
      acceptor_proc_ = challenge.proc();
      note_peer_features(challenge.features());
      v1::Handshake reply;
      auto* response = reply.mutable_response();
      response->set_version(wire::kWireVersion);
      response->set_nonce(my_nonce_);
      response->set_proc(owner_.id());
      response->set_mac(wire::connector_mac(secret, acceptor_nonce_, my_nonce_, owner_.id()));
      response->set_features(my_features());
      write_handshake(reply);
      return;
    }
    if (outgoing_ && hs->has_accept() && !acceptor_nonce_.empty()) {
      if (!wire::mac_equal(hs->accept().mac(),
                           wire::acceptor_mac(secret, my_nonce_, acceptor_nonce_, acceptor_proc_))) {
        protocol_error(absl::PermissionDeniedError(
            absl::StrCat("authentication failed: ", peer_, " does not know the mesh secret")));
        return;
      }
      if (acceptor_proc_ != peer_) {
        CASTMESH_LOG_DEBUG("castmesh-proc {}: dialed {} answered as {}", owner_.id(), peer_,
                           log::printable(acceptor_proc_));
      }
      establish();
      return;
    }
    if (!outgoing_ && hs->has_response()) {
      const v1::Response& response = hs->response();
      if (response.version() != wire::kWireVersion) {
        protocol_error(absl::FailedPreconditionError(absl::StrCat(
            "peer speaks wire version ", response.version(), ", this proc ", wire::kWireVersion)));
        return;
      }
      if (response.nonce().size() != wire::kNonceSize ||
          !wire::mac_equal(response.mac(),
                           wire::connector_mac(secret, my_nonce_, response.nonce(), response.proc()))) {
        protocol_error(absl::PermissionDeniedError(
            absl::StrCat("authentication failed: wrong mesh secret from ", remote_, " (claims to be '",
                         log::printable(response.proc()), "')")));
        return;
      }
      peer_ = response.proc();
      note_peer_features(response.features());
      v1::Handshake reply;
      reply.mutable_accept()->set_mac(wire::acceptor_mac(secret, response.nonce(), my_nonce_, owner_.id()));
      write_handshake(reply);
      establish();
      return;
    }
    protocol_error(absl::InvalidArgumentError("unexpected handshake step"));
  }

  // What this endpoint announces it reads (v1::Feature bits).
  std::uint32_t my_features() const {
    return owner_.options().binary_data_frames ? v1::FEATURE_BINARY_DATA_FRAMES : v1::FEATURE_NONE;
  }

  // The peer's handshake step announced `features`: what this side may
  // send it. Frames queued before are in the forms every peer reads.
  void note_peer_features(std::uint32_t features) {
    detail::MutexLock lock(out_mu_);
    peer_reads_binary_ = owner_.options().binary_data_frames && (features & v1::FEATURE_BINARY_DATA_FRAMES) != 0;
  }

  void protocol_error(const absl::Status& why) {
    if (established_) {
      CASTMESH_LOG_WARN("castmesh-proc {}: closing connection with {} ({}): {}", owner_.id(), peer_, remote_,
                        why.ToString());
    } else if (outgoing_) {
      // A line of its own (rate-limited apart): a flood of refused inbound
      // connections must not hide why this proc's own dial failed.
      CASTMESH_LOG_WARN_LIMITED("castmesh-proc {}: closing connection with {} ({}): {}", owner_.id(), peer_, remote_,
                                why.ToString());
    } else {
      // Anyone who can reach the listener can cause this line: rate-limited.
      CASTMESH_LOG_WARN_LIMITED("castmesh-proc {}: closing connection with {} ({}): {}", owner_.id(),
                                "unauthenticated peer", remote_, why.ToString());
    }
    close(why, true);
  }

  Endpoint::Impl& owner_;
  Socket socket_;
  asio::steady_timer handshake_timer_;
  const bool outgoing_;
  std::string peer_;     // outgoing: the address dialed; incoming: the id proven in the handshake
  std::string remote_;   // socket-level description, for logs
  std::atomic<long> peer_pid_{-1};  // SO_PEERCRED (Unix sockets); -1 unknown
  bool closed_ = false;  // I/O thread
  std::atomic<bool> established_{false};  // written on the I/O thread only
  std::string my_nonce_, acceptor_nonce_, acceptor_proc_;
  std::atomic<Clock::time_point> last_rx_{Clock::time_point{}};  // any reading thread
  Clock::time_point last_tx_{};
  std::string admission_key_;  // accepted and not yet authenticated: whose cap it counts against
  // TLS: set on the I/O thread before the connection's first byte when it
  // speaks TLS, then only read (a sending thread reads it after taking
  // out_mu_ and finding direct_fd_, which establish() sets later);
  // tls_done_ (I/O thread) once both certificates were verified.
  std::unique_ptr<TlsSession> tls_;
  bool tls_done_ = false;
  bool admitted_ = false;

  // Outbound.
  detail::Mutex out_mu_;
  detail::CondVar out_cv_;
  std::vector<Chunk> pending_ ABSL_GUARDED_BY(out_mu_);
  std::size_t queued_bytes_ ABSL_GUARDED_BY(out_mu_) = 0;
  std::uint64_t next_sequence_ ABSL_GUARDED_BY(out_mu_) = 1;
  v1::FrameHeader data_head_ ABSL_GUARDED_BY(out_mu_);  // see append_head()
  bool peer_reads_binary_ ABSL_GUARDED_BY(out_mu_) = false;  // the peer announced binary data frames
  std::string spare_bytes_ ABSL_GUARDED_BY(out_mu_);     // see recycle_locked()
  bool writing_ ABSL_GUARDED_BY(out_mu_) = false;    // a flush is scheduled, or waits for the socket
  bool io_writing_ ABSL_GUARDED_BY(out_mu_) = false;  // the flush holds chunks taken out of the queue
  std::atomic<bool> output_queued_{false};  // writing_, for a reader's look without out_mu_
  bool can_write_ ABSL_GUARDED_BY(out_mu_) = false;  // handshake done: frame headers may be written
  bool out_closed_ ABSL_GUARDED_BY(out_mu_) = false;
  int direct_fd_ ABSL_GUARDED_BY(out_mu_) = -1;  // the socket, for direct writes; -1 once closing
  Clock::time_point last_enqueue_ ABSL_GUARDED_BY(out_mu_){};
  std::string handshake_out_ ABSL_GUARDED_BY(out_mu_);  // handshake frames not yet written

  // Inbound (see "reading" above).
  detail::Mutex read_mu_;
  const std::unique_ptr<char[]> rbuf_;  // its bytes: under read_mu_
  const std::size_t rcap_;
  std::size_t rbegin_ ABSL_GUARDED_BY(read_mu_) = 0;
  std::size_t rend_ ABSL_GUARDED_BY(read_mu_) = 0;
  std::uint64_t expected_sequence_ ABSL_GUARDED_BY(read_mu_) = 1;
  std::uint32_t drain_delivered_ ABSL_GUARDED_BY(read_mu_) = 0;  // frames delivered in this read turn
  // Every frame header is parsed into this one, whose fields keep their
  // memory between frames (a message's handler may take them).
  v1::FrameHeader parsed_ ABSL_GUARDED_BY(read_mu_);
  // A payload larger than what came with its frame header, as it arrives.
  struct PartialPayload {
    bool data = false;        // a data frame (type, header), else a message
    v1::FrameHeader message;  // a message's header
    std::string type, header;
    std::uint64_t sequence = 0;
    std::uint64_t payload_size = 0;
    IncomingHead head() {
      IncomingHead h;
      h.sequence = sequence;
      h.payload_size = payload_size;
      if (data) {
        h.type = type;
        h.header = header;
      } else {
        h.message = &message;
      }
      return h;
    }
    std::shared_ptr<PayloadSink> sink;  // its destination; or, when null:
    wire::Payload payload;              // a buffer of its own,
    char* writable = nullptr;           // whose memory this is
    std::size_t got = 0;                // bytes placed so far
  };
  std::optional<PartialPayload> partial_ ABSL_GUARDED_BY(read_mu_);
  std::atomic<bool> io_turn_{false};      // a reader left the next frame to the I/O thread
  std::atomic<bool> io_pending_{false};   // the I/O thread found read_mu_ held: the holder posts its turn
  std::atomic<bool> read_closed_{false};  // close() began
  bool wait_armed_ = false;               // I/O thread: a wait for readable bytes is pending
  int reader_fd_ = -1;                    // set once in establish(); closed by the destructor
};

thread_local Connection* Connection::t_delivering = nullptr;
thread_local bool Connection::t_followed = false;

// --- Endpoint::Impl ----------------------------------------------------------

absl::Status Endpoint::Impl::start() {
  if (options_.secret.empty()) return absl::InvalidArgumentError("an endpoint needs a non-empty mesh secret");
  wire::route_protobuf_logs();
  absl::StatusOr<wire::FrameLimits> limits = wire::apply_environment(options_.limits);
  if (!limits.ok()) return limits.status();
  options_.limits = *limits;
  if (options_.tls.enabled()) {
    absl::StatusOr<std::shared_ptr<TlsContext>> tls = TlsContext::load(options_.tls);
    if (!tls.ok()) return tls.status();
    tls_ = *std::move(tls);
  }
  if (options_.listen.empty()) {
    id_ = absl::StrCat("anon:", ::getpid(), "-", absl::BytesToHexString(wire::make_nonce().substr(0, 6)));
  } else {
    absl::StatusOr<ChannelAddress> address = parse_channel_address(options_.listen);
    if (!address.ok()) return address.status();
    tcp_listener_ = address->kind == ChannelAddress::Kind::kTcp;
    if (absl::Status st = listen(*address); !st.ok()) return st;
  }
  if (acceptor_) {
    const platform::OpenFileLimit fds = platform::raise_open_file_limit();
    if (fds.after != fds.before) {
      CASTMESH_LOG_INFO("castmesh-proc {}: raised the open-file limit from {} to {}", id_, fds.before, fds.after);
    }
    reserve_fd_ = open_reserve_descriptor();
  }
  work_.emplace(io_.get_executor());
  if (acceptor_) accept_next();
  arm_heartbeat();
  thread_ = std::thread([this] {
    platform::set_current_thread_name("castmesh-io");
    io_.run();
  });
  CASTMESH_LOG_DEBUG("castmesh-proc {}: endpoint up (pid {})", id_, ::getpid());
  return absl::OkStatus();
}

absl::Status Endpoint::Impl::listen(const ChannelAddress& address) {
  if (address.kind == ChannelAddress::Kind::kLocal) {
    detail::MutexLock lock(local_registry().mu);
    if (!local_registry().by_name.emplace(address.name, this).second) {
      return absl::AlreadyExistsError(absl::StrCat("local:", address.name, " is already in use"));
    }
    local_name_ = address.name;
    id_ = address.to_string();
    return absl::OkStatus();
  }
  if (address.kind == ChannelAddress::Kind::kUnix && address.abstract && !abstract_unix_sockets_supported()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot listen on ", address.to_string(),
                                                   ": abstract Unix socket names exist only on Linux; use "
                                                   "unix:/PATH (or an empty listen address for a private one)"));
  }
  absl::StatusOr<GenericEndpoint> ep = to_socket_endpoint(address, io_);
  if (!ep.ok()) return ep.status();
  std::error_code ec;
  acceptor_.emplace(io_);
  acceptor_->open(ep->protocol(), ec);
  if (!ec && address.kind == ChannelAddress::Kind::kTcp) acceptor_->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_->bind(*ep, ec);
  if (ec == asio::error::address_in_use && address.kind == ChannelAddress::Kind::kUnix && !address.abstract) {
    // A socket file left by a dead proc: remove it if nobody answers there.
    asio::local::stream_protocol::socket probe(io_);
    std::error_code probe_ec;
    probe.connect(asio::local::stream_protocol::endpoint(address.name), probe_ec);
    if (probe_ec == asio::error::connection_refused) {
      ::unlink(address.name.c_str());
      ec.clear();
      acceptor_->bind(*ep, ec);
    }
  }
  if (!ec) acceptor_->listen(asio::socket_base::max_listen_connections, ec);
  // Non-blocking, so that refusing one pending connection by hand when out
  // of descriptors never blocks the I/O thread.
  if (!ec) acceptor_->non_blocking(true, ec);
  if (ec) {
    acceptor_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address.to_string(), ": ", ec.message()));
  }
  ChannelAddress bound = address;
  if (address.kind == ChannelAddress::Kind::kTcp) {
    if (!options_.advertise_host.empty()) bound.host = options_.advertise_host;
    GenericEndpoint local = acceptor_->local_endpoint();
    const auto* sa = reinterpret_cast<const sockaddr*>(local.data());
    if (sa->sa_family == AF_INET) bound.port = ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
    if (sa->sa_family == AF_INET6) bound.port = ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  }
  if (address.kind == ChannelAddress::Kind::kUnix && !address.abstract) unix_path_ = address.name;
  id_ = bound.to_string();
  return absl::OkStatus();
}

void Endpoint::Impl::accept_next() {
  acceptor_->async_accept([this](const std::error_code& ec, Socket socket) {
    if (stopping() || ec == asio::error::operation_aborted) return;
    if (ec) {
      on_accept_error(ec);
      return;
    }
    accept_backoff_ = std::chrono::milliseconds(0);
    admit(std::move(socket));
    accept_next();
  });
}

// A failed accept is retried after a pause (10 ms doubling to 1 s), never at
// once: the listener stays readable, and retrying at once spins the I/O
// thread (and the log) for as long as the cause lasts.
void Endpoint::Impl::on_accept_error(const std::error_code& ec) {
  const bool out_of_descriptors = ec.value() == EMFILE || ec.value() == ENFILE;
  if (out_of_descriptors) {
    out_of_descriptors_until_ = Clock::now() + std::chrono::seconds(10);
    refuse_pending();
  }
  accept_backoff_ = std::clamp(accept_backoff_ * 2, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
  CASTMESH_LOG_WARN_LIMITED("castmesh-proc {}: accept failed: {}{}; accepting again in {} ms", id_, ec.message(),
                            out_of_descriptors
                                ? absl::StrCat(" (open-file limit ", platform::raise_open_file_limit().after,
                                               "; pending connections were refused)")
                                : "",
                            accept_backoff_.count());
  accept_timer_.expires_after(accept_backoff_);
  accept_timer_.async_wait([this](const std::error_code& timer_ec) {
    if (!timer_ec && !stopping()) accept_next();
  });
}

void Endpoint::Impl::refuse_pending() {
  if (reserve_fd_ >= 0) ::close(reserve_fd_);
  // Up to a backlog's worth per round: a flood is refused at once instead of
  // waiting in the backlog for descriptors (and the pause) to free up.
  for (int refused = 0; refused < kRefusedPerRound; ++refused) {
    const int fd = ::accept(acceptor_->native_handle(), nullptr, nullptr);
    if (fd < 0) break;
    ::close(fd);
  }
  reserve_fd_ = open_reserve_descriptor();
}

void Endpoint::Impl::admit(Socket socket) {
  std::string key = admission_key(socket.native_handle());
  std::size_t& from_peer = unauthenticated_by_peer_[key];
  if (unauthenticated_ >= options_.max_unauthenticated || from_peer >= options_.max_unauthenticated_per_peer) {
    const bool per_peer = from_peer >= options_.max_unauthenticated_per_peer;
    if (from_peer == 0) unauthenticated_by_peer_.erase(key);
    CASTMESH_LOG_WARN_LIMITED("castmesh-proc {}: refused a connection from {}: {} connections{} are already in "
                              "their handshake (the limit)",
                              id_, key, per_peer ? options_.max_unauthenticated_per_peer : options_.max_unauthenticated,
                              per_peer ? " from there" : "");
    std::error_code ignored;
    socket.close(ignored);
    return;
  }
  ++from_peer;
  ++unauthenticated_;
  auto connection = std::make_shared<Connection>(*this, /*outgoing=*/false, std::string());
  connection->socket() = std::move(socket);
  {
    detail::MutexLock lock(peers_mu_);
    connections_.insert(connection);
  }
  connection->start_accepted(std::move(key), handshake_deadline());
}

void Endpoint::Impl::release_admission(Connection& connection) {
  std::string key;
  if (!connection.take_admission(&key)) return;
  --unauthenticated_;
  auto it = unauthenticated_by_peer_.find(key);
  if (it != unauthenticated_by_peer_.end() && --it->second == 0) unauthenticated_by_peer_.erase(it);
}

absl::Duration Endpoint::Impl::handshake_deadline() const {
  const bool pressure = unauthenticated_ > options_.max_unauthenticated / 2 || Clock::now() < out_of_descriptors_until_;
  if (!pressure) return options_.handshake_timeout;
  return std::min(options_.handshake_timeout, std::max(options_.handshake_timeout / 5, absl::Milliseconds(200)));
}

void Endpoint::Impl::arm_heartbeat() {
  absl::Duration interval;
  {
    detail::MutexLock lock(peers_mu_);
    if (tick_interval_ == absl::ZeroDuration()) tick_interval_ = options_.heartbeat_interval;
    interval = tick_interval_;
  }
  heartbeat_timer_.expires_after(absl::ToChronoNanoseconds(interval));
  heartbeat_timer_.async_wait([this](const std::error_code& ec) {
    if (ec || stopping()) return;
    std::vector<std::pair<std::shared_ptr<Connection>, HeartbeatSettings>> all;
    const HeartbeatSettings standard{options_.heartbeat_interval, options_.heartbeat_timeout};
    {
      detail::MutexLock lock(peers_mu_);
      all.reserve(connections_.size());
      for (const auto& connection : connections_) {
        auto own = peer_heartbeats_.empty() ? peer_heartbeats_.end() : peer_heartbeats_.find(connection->peer());
        all.emplace_back(connection, own == peer_heartbeats_.end() ? standard : own->second);
      }
    }
    const auto now = Clock::now();
    for (auto& [connection, heartbeat] : all) connection->tick(now, heartbeat);
    end_idle_deferral(now);
    arm_heartbeat();
  });
}

void Endpoint::Impl::set_peer_heartbeat(std::string_view peer, HeartbeatSettings heartbeat) {
  detail::MutexLock lock(peers_mu_);
  peer_heartbeats_[std::string(peer)] = heartbeat;
  tick_interval_ = options_.heartbeat_interval;
  for (const auto& [name, settings] : peer_heartbeats_) tick_interval_ = std::min(tick_interval_, settings.interval);
}

void Endpoint::Impl::shutdown() {
  if (stopping_.exchange(true, std::memory_order_acq_rel)) return;
  if (!local_name_.empty()) {
    detail::MutexLock lock(local_registry().mu);
    local_registry().by_name.erase(local_name_);
  }
  if (thread_.joinable()) {
    asio::post(io_, [this] {
      heartbeat_timer_.cancel();
      accept_timer_.cancel();
      if (acceptor_) {
        std::error_code ignored;
        acceptor_->close(ignored);
      }
      std::vector<std::shared_ptr<Connection>> all;
      {
        detail::MutexLock lock(peers_mu_);
        all.assign(connections_.begin(), connections_.end());
      }
      for (auto& connection : all) connection->close(absl::CancelledError("endpoint shut down"), false);
    });
    work_.reset();
    thread_.join();
  }
  {
    detail::MutexLock lock(peers_mu_);
    peers_.clear();
    connections_.clear();
  }
  if (!unix_path_.empty()) ::unlink(unix_path_.c_str());
  if (reserve_fd_ >= 0) ::close(reserve_fd_);
  reserve_fd_ = -1;
  if (id_.empty()) return;
  CASTMESH_LOG_DEBUG("castmesh-proc {}: endpoint down", id_);
}

absl::Status Endpoint::Impl::send(std::string_view peer, Outgoing out, wire::Payload payload, SendUrgency urgency) {
  // enqueue() copies a payload of at most kInlinePayloadLimit bytes into its
  // queue; every other route keeps the payload after this call returns.
  if (payload.borrowed() && (peer == id_ || peer.starts_with("local:") || payload.size() > kInlinePayloadLimit)) {
    payload = payload.owned();
  }
  if (peer == id_ || peer.starts_with("local:")) return send_in_process(peer, out, std::move(payload));
  if (payload.size() > options_.limits.max_payload_size) {
    // The receiver would close the connection (every proc of a mesh has
    // the same limit unless configured otherwise): refuse it here instead.
    return absl::InvalidArgumentError(absl::StrCat("a payload of ", payload.size(),
                                                   " bytes exceeds the per-message limit of ",
                                                   options_.limits.max_payload_size, " bytes (",
                                                   wire::kEnvMaxMessageBytes, ", docs/security.md)"));
  }
  std::shared_ptr<Connection> connection;
  std::optional<ChannelAddress> dial;
  {
    detail::MutexLock lock(peers_mu_);
    if (stopping()) return absl::FailedPreconditionError("endpoint is shutting down");
    auto it = peers_.find(absl::string_view(peer.data(), peer.size()));  // no temporary string
    if (it != peers_.end()) {
      connection = it->second;
    } else {
      absl::StatusOr<ChannelAddress> address = parse_channel_address(peer);
      if (!address.ok()) {
        return absl::UnavailableError(absl::StrCat("no connection to ", std::string(peer), " and it is not dialable: ",
                                                   address.status().message()));
      }
      connection = std::make_shared<Connection>(*this, /*outgoing=*/true, std::string(peer));
      peers_.emplace(std::string(peer), connection);
      connections_.insert(connection);
      dial = *address;
    }
  }
  // Queue first, then dial: a dial that fails at once must not race this
  // frame into an "already closed" error (the loss is reported instead).
  const bool from_io = on_io_thread();
  if (from_io) ++io_thread_sends_;
  absl::Status queued = connection->enqueue(out, std::move(payload), from_io, urgency);
  if (dial) {
    CASTMESH_LOG_DEBUG("castmesh-proc {}: dialing {}", id_, std::string(peer));
    asio::post(io_, [connection, address = *dial] { connection->start_dial(address); });
  }
  return queued;
}

absl::Status Endpoint::Impl::send_in_process(std::string_view peer, Outgoing out, wire::Payload payload) {
  std::optional<v1::FrameHeader> message;
  if (out.message != nullptr) {
    message = std::move(*out.message);
    message->set_version(wire::kWireVersion);
    message->set_payload_size(payload.size());
  }
  auto delivery = [from = id_, message = std::move(message), type = std::string(out.data_type),
                   header = std::string(out.data_header), payload = std::move(payload)](Impl* target) mutable {
    return [target, from = std::move(from), message = std::move(message), type = std::move(type),
            header = std::move(header), payload = std::move(payload)]() mutable {
      if (message.has_value()) {
        target->deliver(from, *std::move(message), std::move(payload));
      } else {
        target->deliver_data(from, type, header, std::move(payload));
      }
    };
  };
  if (peer == id_) {
    asio::post(io_, delivery(this));
    return absl::OkStatus();
  }
  detail::MutexLock lock(local_registry().mu);
  auto it = local_registry().by_name.find(std::string(peer.substr(6)));
  if (it == local_registry().by_name.end()) {
    return absl::UnavailableError(absl::StrCat("no endpoint listens on ", std::string(peer), " in this process"));
  }
  Impl* target = it->second;
  // Posted while the registry lock is held, so the target cannot finish
  // shutting down in between; it runs everything posted before it joins.
  asio::post(target->io_, delivery(target));
  return absl::OkStatus();
}

void Endpoint::Impl::disconnect(std::string_view peer) {
  asio::post(io_, [this, peer = std::string(peer)] {
    std::shared_ptr<Connection> connection;
    {
      detail::MutexLock lock(peers_mu_);
      auto it = peers_.find(peer);
      if (it == peers_.end()) return;
      connection = it->second;
    }
    connection->close(absl::CancelledError("disconnected"), false);
  });
}

std::optional<long> Endpoint::Impl::peer_pid(std::string_view peer) const {
  detail::MutexLock lock(peers_mu_);
  auto it = peers_.find(std::string(peer));
  if (it == peers_.end() || !it->second->established() || it->second->peer_pid() <= 0) return std::nullopt;
  return it->second->peer_pid();
}

std::vector<std::string> Endpoint::Impl::peers() const {
  detail::MutexLock lock(peers_mu_);
  std::vector<std::string> out;
  for (const auto& [peer, connection] : peers_) {
    if (connection->established()) out.push_back(peer);
  }
  return out;
}

void Endpoint::Impl::on_established(const std::shared_ptr<Connection>& connection) {
  release_admission(*connection);
  {
    detail::MutexLock lock(peers_mu_);
    peers_.try_emplace(connection->peer(), connection);
  }
  CASTMESH_LOG_DEBUG("castmesh-proc {}: peer {} up ({})", id_, connection->peer(), connection->remote());
}

void Endpoint::Impl::on_closed(const std::shared_ptr<Connection>& connection, const absl::Status& why, bool report) {
  release_admission(*connection);
  bool peer_gone = false;
  {
    detail::MutexLock lock(peers_mu_);
    connections_.erase(connection);
    auto it = peers_.find(connection->peer());
    if (it != peers_.end() && it->second == connection) {
      peers_.erase(it);
      peer_gone = true;
      // Another authenticated connection with the same peer (both dialed at
      // once) takes over sending.
      for (const auto& other : connections_) {
        if (other->established() && other->peer() == connection->peer()) {
          peers_.emplace(connection->peer(), other);
          peer_gone = false;
          break;
        }
      }
    }
  }
  if (!peer_gone || stopping()) return;
  CASTMESH_LOG_DEBUG("castmesh-proc {}: peer {} down: {}", id_, connection->peer(), why.ToString());
  if (report && on_peer_lost_) {
    try {
      on_peer_lost_(connection->peer(), why);
    } catch (const std::exception& e) {
      CASTMESH_LOG_ERROR("castmesh-proc {}: peer-lost handler threw: {}", id_, e.what());
    }
  }
}

void Endpoint::Impl::deliver(const std::string& peer, v1::FrameHeader&& frame_header, wire::Payload payload) {
  if (stopping() || !on_message_) return;
  try {
    on_message_(peer, std::move(frame_header), std::move(payload));
  } catch (const std::exception& e) {
    CASTMESH_LOG_ERROR("castmesh-proc {}: message handler threw on a message from {}: {}", id_, peer, e.what());
  }
}

void Endpoint::Impl::deliver_data(const std::string& peer, std::string_view type, std::string_view header,
                                  wire::Payload payload) {
  if (stopping() || !data_.deliver) return;
  try {
    data_.deliver(peer, type, header, std::move(payload));
  } catch (const std::exception& e) {
    CASTMESH_LOG_ERROR("castmesh-proc {}: data handler threw on a '{}' frame from {}: {}", id_,
                       log::printable(type), peer, e.what());
  }
}

// --- Endpoint ----------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Endpoint>> Endpoint::start(EndpointOptions options, MessageHandler on_message,
                                                          PeerLostHandler on_peer_lost,
                                                          DataHandlers data) {
  auto impl = std::make_unique<Impl>(std::move(options), std::move(on_message), std::move(on_peer_lost),
                                     std::move(data));
  if (absl::Status st = impl->start(); !st.ok()) return st;
  return std::unique_ptr<Endpoint>(new Endpoint(std::move(impl)));
}

Endpoint::Endpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Endpoint::~Endpoint() = default;  // Impl::~Impl shuts down
void Endpoint::shutdown() { impl_->shutdown(); }
const std::string& Endpoint::id() const { return impl_->id(); }
absl::Status Endpoint::send(std::string_view peer, v1::FrameHeader frame_header, wire::Payload payload,
                            SendUrgency urgency) {
  return impl_->send(peer, Outgoing(&frame_header), std::move(payload), urgency);
}
absl::Status Endpoint::send_data(std::string_view peer, std::string_view type, std::string_view header,
                                 wire::Payload payload, SendUrgency urgency) {
  return impl_->send(peer, Outgoing(type, header), std::move(payload), urgency);
}
void Endpoint::disconnect(std::string_view peer) { impl_->disconnect(peer); }
void Endpoint::set_peer_heartbeat(std::string_view peer, HeartbeatSettings heartbeat) {
  impl_->set_peer_heartbeat(peer, heartbeat);
}
std::vector<std::string> Endpoint::peers() const { return impl_->peers(); }
std::optional<long> Endpoint::peer_pid(std::string_view peer) const { return impl_->peer_pid(peer); }
bool Endpoint::on_io_thread() const { return impl_->on_io_thread(); }

namespace {
// A PeerReader of one connection. It does not keep the connection alive
// (a connection must not outlive its endpoint's I/O context); its own
// descriptor stays valid for poll() whatever happens to the connection.
class ConnectionReader final : public PeerReader {
 public:
  ConnectionReader(const std::shared_ptr<Connection>& connection, int fd, FrameFilter mine)
      : connection_(connection), fd_(fd), mine_(std::move(mine)) {}
  ~ConnectionReader() override { ::close(fd_); }
  ConnectionReader(const ConnectionReader&) = delete;
  ConnectionReader& operator=(const ConnectionReader&) = delete;
  int fd() const override { return fd_; }
  Pumped pump() override {
    std::shared_ptr<Connection> connection = connection_.lock();
    return connection == nullptr ? Pumped::kGone : connection->pump_here(mine_);
  }
  bool push() override {
    std::shared_ptr<Connection> connection = connection_.lock();
    return connection != nullptr && connection->push_here();
  }
  void defer_io_thread() override {
    // A live connection means a live endpoint (connections do not outlive it).
    if (std::shared_ptr<Connection> connection = connection_.lock(); connection != nullptr) {
      connection->owner().defer_io_thread();
    }
  }

 private:
  const std::weak_ptr<Connection> connection_;
  const int fd_;
  const FrameFilter mine_;
};
}  // namespace

bool Endpoint::delivering_followed() { return Connection::delivering_followed(); }

std::shared_ptr<PeerReader> Endpoint::delivering_reader(FrameFilter mine) {
  Connection* connection = Connection::delivering();
  if (connection == nullptr || connection->reader_fd() < 0) return nullptr;
  const int fd = ::fcntl(connection->reader_fd(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return nullptr;  // out of descriptors: the I/O thread reads everything
  return std::make_shared<ConnectionReader>(connection->shared_from_this(), fd, std::move(mine));
}
void Endpoint::post(std::function<void()> fn) { impl_->post(std::move(fn)); }

}  // namespace castmesh::transport
