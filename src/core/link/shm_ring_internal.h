// Internals of the shared-memory ring path (shm_ring_path.h), shared by its
// files: shm_ring_path.cc (the links' registry, the handshake, a lost peer,
// counters), shm_ring_send.cc (writing frames into a ring, back-pressure),
// shm_ring_receive.cc (reading a ring and delivering its records) and
// shm_ring_waits.cc (waiters and the progress thread on the rings).
// Not for use outside them.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "castmesh/address.h"
#include "castmesh/config.h"
#include "castmesh/detail/mutex.h"
#include "core/link/link.h"
#include "core/link/shm_ring_path.h"
#include "core/progress/progress_engine.h"
#include "core/progress/request_state.h"
#include "core/shm_link/shm_ring.h"

namespace castmesh::wire::v1 {
class CollectiveHeader;
}

namespace castmesh::link::shm_ring {

namespace v1 = wire::v1;
using shm_link::ShmRing;

// Record kinds in a ring.
constexpr uint32_t kFrame = 1;      // meta: header; body: the whole body
constexpr uint32_t kFirstPart = 2;  // meta: u64 total body size + header; body: the first chunk
constexpr uint32_t kMorePart = 3;   // body: the next chunk
constexpr uint32_t kCompact = 4;    // meta: CompactHeader, comm, signature; body: the whole body
// LINK_ACCEPT's link_features: the receiver reads kCompact records.
constexpr uint32_t kFeatureCompact = 1;

// The fixed part of a kCompact record's meta (both ends are on one host and
// run one build of this file, checked by the link handshake's features).
struct CompactHeader {
  uint32_t comm_size;
  uint32_t signature_size;
  uint32_t source;
  uint32_t dest;
  int64_t tag;
  uint64_t sequence;
  uint32_t collective;  // 0 or 1
  uint32_t reserved;    // 0
};
static_assert(sizeof(CompactHeader) == 40);
constexpr size_t kChunk = kShmRingBytes / 4;
constexpr size_t kMaxHeader = 16 * 1024;  // so a first part (header + chunk) fits max_payload()

inline bool enabled() {
  static const bool on = config::global().shm;
  return on;
}

// Set on threads that must not wait for ring space: I/O threads (they
// deliver socket frames), the progress thread and ring consumers.
extern thread_local bool t_progress_context;
// Set on the progress thread (for the frames_by_drain counter).
extern thread_local bool t_drain_thread;

using ProgressContext = ShmProgressScope;

extern std::atomic<uint64_t> g_frames_in, g_frames_out, g_waiter_sleeps, g_frames_by_drain;
// Body bytes this process sent by each path (data_path_bytes()).
extern std::atomic<uint64_t> g_shm_bytes_out, g_socket_bytes_out;

// A link handshake frame (CHANNEL_LINK_*): always over the socket, as its own type.
absl::Status link_send(proc::ProcHost& host, const ProcId& peer, const v1::CollectiveHeader& header);

// One frame (or compact record) on its way into a ring, possibly in
// several records.
struct Outgoing {
  Outgoing(uint32_t k, std::string_view h, std::string_view b) : kind(k), header(h), body(b) {}
  uint32_t kind = kFrame;  // kFrame (split into parts when large) or kCompact
  std::string_view header;
  std::string_view body;
  size_t offset = 0;
  bool started = false;
  std::string owned_header, owned_body;  // the bytes, once queued
};

enum class OutState { kNone, kOffered, kStarted, kRefused };

// Both directions of the link with one peer proc.
struct Peer {
  explicit Peer(ProcId p) : id(std::move(p)) {}
  const ProcId id;
  std::atomic<bool> lost{false};
  std::atomic<bool> broken{false};  // the inbound ring held garbage: never read again
  std::atomic<bool> compact_ok{false};  // the receiver reads kCompact records (set before kStarted)

  // Outbound. Caller threads serialise on send_mu; whoever writes into the
  // ring (a caller, or a progress context flushing the backlog) holds
  // `producing`, a try-lock, so progress contexts never wait for a caller.
  detail::Mutex send_mu;
  std::atomic<OutState> out_state{OutState::kNone};
  std::unique_ptr<ShmRing> outbound;  // set under send_mu before kStarted; then fixed
  std::atomic_flag producing = ATOMIC_FLAG_INIT;
  detail::Mutex backlog_mu;
  std::deque<Outgoing> backlog ABSL_GUARDED_BY(backlog_mu);
  std::atomic<bool> has_backlog{false};

  // Inbound: set once by the offer, consumed once started.
  std::weak_ptr<proc::ProcHost> host;  // set with inbound
  std::unique_ptr<ShmRing> inbound;
  std::atomic<bool> inbound_started{false};
  std::atomic_flag consuming = ATOMIC_FLAG_INIT;
  // The frame being reassembled from parts (consumer only).
  std::string part_header;
  std::string part_body;
  uint64_t part_total = 0;

  // Served by the progress thread (RingDrain) once set.
  std::atomic<bool> drain_started{false};
  // The progress thread armed the inbound ring's doorbell (RingDrain::arm; its thread only).
  bool drain_armed = false;

  // The progress thread has work for this peer (queued sends).
  void wake_drain() { progress::ProgressEngine::instance().wake_background(); }
};

// The peer lists that waiters and the progress thread read without a lock
// (Links::readers_, drains_) are replaced, never changed: a copy with `p`
// added, or without it.
using PeerList = std::vector<std::shared_ptr<Peer>>;
std::shared_ptr<const PeerList> with_peer(const PeerList& list, const std::shared_ptr<Peer>& p);
std::shared_ptr<const PeerList> without_peer(const PeerList& list, const std::shared_ptr<Peer>& p);

struct SendCache;

class Links {
 public:
  static Links& instance() {
    static auto* links = new Links;  // leaked: the progress thread may run during exit
    return *links;
  }

  absl::Status send(proc::ProcHost& host, const ProcId& peer, std::string_view header, std::string_view body,
                    std::shared_ptr<const void> owner);
  std::optional<absl::Status> try_send_compact(const ProcId& peer, const Envelope& m, std::string_view body);
  void on_link_frame(proc::ProcHost& host, const ProcId& peer, const v1::CollectiveHeader& h);
  void on_peer_lost(const ProcId& peer, const absl::Status& why);
  void on_peer_alive(const ProcId& peer);
  // Consumes what every started inbound ring holds (try-locks). True if it
  // handled a record.
  bool poll();
  ShmPathStats stats();
  // Whether frames to `peer` go through its ring now.
  bool started(const ProcId& peer) {
    std::shared_ptr<Peer> p = find(peer);
    return p != nullptr && !p->lost.load(std::memory_order_acquire) &&
           p->out_state.load(std::memory_order_acquire) == OutState::kStarted;
  }
  // The peers whose inbound ring is started (what a waiting caller polls).
  std::shared_ptr<const std::vector<std::shared_ptr<Peer>>> readers();
  // The peers the progress thread serves.
  std::shared_ptr<const std::vector<std::shared_ptr<Peer>>> drains();
  // What one look at a peer's inbound ring did.
  enum class Consumed { kNothing, kHandled, kBusy /* another thread holds it */ };
  Consumed consume(Peer& p);
  static bool flush_backlog(Peer& p);
  // The sleeping half of a waiter's wait on `peers` (RingWaits::sleep).
  bool sleep(detail::RequestState& request, const std::vector<std::shared_ptr<Peer>>& peers, absl::Time deadline);
  // The started inbound rings, each marked polled once more (ShmPollScope).
  std::shared_ptr<const std::vector<std::shared_ptr<Peer>>> hold_polled();
  // Ends hold_polled(), then reads what came meanwhile.
  void release_polled(const std::vector<std::shared_ptr<Peer>>& peers);

 private:
  std::shared_ptr<Peer> find(const ProcId& peer);
  std::shared_ptr<Peer> get(const ProcId& peer);
  absl::Status send_started(Peer& p, Outgoing out);
  // The peer's link state, through this thread's `cache` (no lock, no
  // hashing, no reference count on the hot path); nullptr: the thread's
  // caches are gone, and `hold` keeps the Peer alive.
  Peer* cached(SendCache* cache, const ProcId& peer, std::shared_ptr<Peer>& hold);
  void start_drain(const std::shared_ptr<Peer>& p);
  void offer(proc::ProcHost& host, Peer& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.send_mu);
  void on_offer(proc::ProcHost& host, const ProcId& peer, const std::string& name);
  void on_accept(proc::ProcHost& host, const ProcId& peer, const v1::CollectiveHeader& h);
  void on_start(const ProcId& peer);

  detail::Mutex mu_;
  absl::flat_hash_map<ProcId, std::shared_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  // The peers whose inbound ring is started (what a waiting caller polls).
  std::shared_ptr<const std::vector<std::shared_ptr<Peer>>> readers_ ABSL_GUARDED_BY(mu_) =
      std::make_shared<std::vector<std::shared_ptr<Peer>>>();
  // The peers the progress thread serves (start_drain), until lost.
  std::shared_ptr<const std::vector<std::shared_ptr<Peer>>> drains_ ABSL_GUARDED_BY(mu_) =
      std::make_shared<std::vector<std::shared_ptr<Peer>>>();
};

}  // namespace castmesh::link::shm_ring
