#include "core/collectives/shm_path.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "castmesh/config.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/wire/v1/collectives.pb.h"
#include "core/collectives/exchange.h"
#include "core/collectives/thread_cache.h"
#include "core/log/log.h"
#include "core/platform/process.h"
#include "core/platform/process_memory.h"
#include "core/proc/proc_host.h"
#include "core/progress/progress_engine.h"
#include "core/progress/request_state.h"
#include "core/scheduler/futex.h"
#include "core/scheduler/scheduler.h"
#include "core/shm_link/shm_ring.h"

namespace castmesh::collectives {
namespace {

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
// How long a waiting caller spins on the rings before it sleeps (1 ms: the
// default of shm_spin_us in the settings table, castmesh/config.h). Longer
// than a hand-off through the progress thread under load (two thread wake-ups,
// which took 80 us to over 1 ms on the shared 2-core VM): with a shorter spin
// two ranks settle into both sleeping at every hop (measured: 50 us and
// 200 us spins gave 60-300 us per hop in some runs against 1-2 us).
// The spin pauses (cpu_relax) rather than yielding the core unless the core
// is wanted (progress/wait_policy.h): yielding after the first 10 us avoided
// the 1 ms steps at load 5-7, but in an A/B at load 2 it was slower
// (allreduce 8 B 2.2-15 us against 2.1-3.1 us, and 64 KiB took 0.7-1 ms in 2
// of 5 runs against 25-47 us). Measured in bench/RESULTS.md.

// The spin before a waiter sleeps: shm_spin_us (separately when procs
// outnumber cores: shm_spin_oversubscribed_us). Read once per process.
absl::Duration wait_spin(bool oversubscribed) {
  static const absl::Duration normal = config::global().shm_spin;
  static const absl::Duration crowded = config::global().shm_spin_oversubscribed.value_or(normal);
  return oversubscribed ? crowded : normal;
}

// shm_waiter_sleep=0 (CASTMESH_SHM_WAITER_SLEEP): a waiter sleeps on its request after the
// spin and the progress thread serves it (the path before the waiter bells; for
// A/B measurements, and the behaviour where futex_waitv is missing).
bool waiter_sleep_enabled() {
  static const bool on = config::global().shm_waiter_sleep;
  return on;
}

bool enabled() {
  static const bool on = config::global().shm;
  return on;
}

// Set on threads that must not wait for ring space: I/O threads (they
// deliver socket frames), the progress thread and ring consumers.
thread_local bool t_progress_context = false;

using ProgressContext = ShmProgressScope;

std::atomic<uint64_t> g_frames_in{0}, g_frames_out{0}, g_waiter_sleeps{0}, g_frames_by_drain{0};
// Body bytes this process sent by each path (data_path_bytes()).
std::atomic<uint64_t> g_shm_bytes_out{0}, g_socket_bytes_out{0};
// Set on the progress thread (for the frames_by_drain counter).
thread_local bool t_drain_thread = false;

// `owner`, when set, keeps `body` valid until the transport has written it
// (the socket path then sends it in place, without a copy).
absl::Status socket_send(proc::ProcHost& host, const ProcId& peer, std::string_view header, std::string_view body,
                         std::shared_ptr<const void> owner = nullptr) {
  // Without an owner the body is borrowed: the transport copies what it keeps.
  g_socket_bytes_out.fetch_add(body.size(), std::memory_order_relaxed);
  return host.send_data(peer, kCollectiveDataType, header,
                        owner != nullptr ? wire::Payload::share(std::move(owner), body.data(), body.size())
                                         : wire::Payload::borrow(body));
}

// A link handshake frame (CHANNEL_LINK_*): always over the socket, as its own type.
absl::Status link_send(proc::ProcHost& host, const ProcId& peer, const v1::CollectiveHeader& header) {
  return host.send_data(peer, kCollectiveLinkDataType, header.SerializeAsString());
}

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

// Queues `out` at the back (or front) of `backlog` with its own copy of its
// bytes (made in place: a moved std::string may move its bytes).
void queue_owned(std::deque<Outgoing>& backlog, Outgoing&& out, bool front) {
  Outgoing& q = front ? backlog.emplace_front(std::move(out)) : backlog.emplace_back(std::move(out));
  q.owned_header.assign(q.header.data(), q.header.size());
  q.owned_body.assign(q.body.data(), q.body.size());
  q.header = q.owned_header;
  q.body = q.owned_body;
}

// Writes as much of `out` as the ring takes now; true when all of it went.
bool write_some(ShmRing& ring, Outgoing& out) {
  if (!out.started) {
    if (out.header.size() + out.body.size() <= kChunk) {
      if (!ring.try_write(out.kind, out.header, out.body)) return false;
      out.offset = out.body.size();
      out.started = true;
      return true;
    }
    std::string meta(8, '\0');
    const uint64_t total = out.body.size();
    std::memcpy(meta.data(), &total, 8);
    meta.append(out.header);
    const size_t n = std::min(out.body.size(), kChunk);
    if (!ring.try_write(kFirstPart, meta, out.body.substr(0, n))) return false;
    out.offset = n;
    out.started = true;
  }
  while (out.offset < out.body.size()) {
    const size_t n = std::min(out.body.size() - out.offset, kChunk);
    if (!ring.try_write(kMorePart, {}, out.body.substr(out.offset, n))) return false;
    out.offset += n;
  }
  return true;
}

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
std::shared_ptr<const PeerList> with_peer(const PeerList& list, const std::shared_ptr<Peer>& p) {
  auto next = std::make_shared<PeerList>(list);
  next->push_back(p);
  return next;
}
std::shared_ptr<const PeerList> without_peer(const PeerList& list, const std::shared_ptr<Peer>& p) {
  auto next = std::make_shared<PeerList>();
  for (const auto& q : list) {
    if (q != p) next->push_back(q);
  }
  return next;
}

struct SendCache;

class Links {
 public:
  static Links& instance() {
    static auto* links = new Links;  // leaked: the progress thread may run during exit
    return *links;
  }

  absl::Status send(proc::ProcHost& host, const ProcId& peer, std::string_view header, std::string_view body,
                    std::shared_ptr<const void> owner);
  std::optional<absl::Status> try_send_compact(const ProcId& peer, const CompactMessage& m, std::string_view body);
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

std::shared_ptr<Peer> Links::find(const ProcId& peer) {
  detail::MutexLock lock(mu_);
  auto it = peers_.find(peer);
  return it == peers_.end() ? nullptr : it->second;
}

std::shared_ptr<Peer> Links::get(const ProcId& peer) {
  detail::MutexLock lock(mu_);
  std::shared_ptr<Peer>& p = peers_[peer];
  if (p == nullptr) p = std::make_shared<Peer>(peer);
  return p;
}

std::shared_ptr<const std::vector<std::shared_ptr<Peer>>> Links::readers() {
  detail::MutexLock lock(mu_);
  return readers_;
}

std::shared_ptr<const std::vector<std::shared_ptr<Peer>>> Links::drains() {
  detail::MutexLock lock(mu_);
  return drains_;
}

absl::Status Links::send(proc::ProcHost& host, const ProcId& peer, std::string_view header, std::string_view body,
                         std::shared_ptr<const void> owner) {
  if (!enabled() || !platform::proc_on_this_host(peer)) return socket_send(host, peer, header, body, std::move(owner));
  std::shared_ptr<Peer> p = get(peer);
  if (p->lost.load(std::memory_order_acquire)) return socket_send(host, peer, header, body, std::move(owner));
  if (p->out_state.load(std::memory_order_acquire) == OutState::kStarted) {
    return send_started(*p, Outgoing(kFrame, header, body));
  }
  detail::MutexLock lock(p->send_mu);
  // Under send_mu until LINK_START has gone, so no socket frame follows it.
  switch (p->out_state.load(std::memory_order_acquire)) {
    case OutState::kStarted:
      lock.unlock();
      return send_started(*p, Outgoing(kFrame, header, body));
    case OutState::kNone:
      offer(host, *p);
      break;
    case OutState::kOffered:
    case OutState::kRefused:
      break;
  }
  return socket_send(host, peer, header, body, std::move(owner));
}

void Links::offer(proc::ProcHost& host, Peer& p) {
  absl::StatusOr<std::unique_ptr<ShmRing>> ring = ShmRing::Create(kShmRingBytes);
  if (!ring.ok()) {
    CASTMESH_LOG_INFO("castmesh-collectives: no shared-memory link to {} ({}); its frames go over the socket", p.id,
                      std::string(ring.status().message()));
    p.out_state.store(OutState::kRefused, std::memory_order_release);
    return;
  }
  v1::CollectiveHeader h;
  h.set_channel(v1::CollectiveHeader::CHANNEL_LINK_OFFER);
  h.set_link((*ring)->name());
  p.outbound = *std::move(ring);
  p.out_state.store(OutState::kOffered, std::memory_order_release);
  if (!link_send(host, p.id, h).ok()) {
    p.outbound.reset();  // unlinks
    p.out_state.store(OutState::kRefused, std::memory_order_release);
  }
}

struct CachedPeer {
  ProcId id;
  std::shared_ptr<Peer> p;
};
// One per sending thread (one thread-local lookup per message).
struct SendCache {
  std::vector<CachedPeer> entries;  // a rank talks to a handful of procs
  std::string meta;  // a compact record's meta, kept between calls: no allocation per message
};

Peer* Links::cached(SendCache* cache, const ProcId& peer, std::shared_ptr<Peer>& hold) {
  if (cache == nullptr) {
    hold = get(peer);
    return hold.get();
  }
  // The entries keep their peers alive, and only this thread changes them
  // (never from a progress context, which sends nothing compact): a plain
  // pointer stays valid for the caller's send.
  for (CachedPeer& e : cache->entries) {
    if (e.id == peer) {
      // A lost peer's entry may be replaced once it answers again.
      if (e.p->lost.load(std::memory_order_acquire)) e.p = get(peer);
      return e.p.get();
    }
  }
  if (cache->entries.size() >= 16) cache->entries.erase(cache->entries.begin());
  cache->entries.push_back(CachedPeer{peer, get(peer)});
  return cache->entries.back().p.get();
}

std::optional<absl::Status> Links::try_send_compact(const ProcId& peer, const CompactMessage& m,
                                                    std::string_view body) {
  if (t_progress_context || !enabled()) return std::nullopt;
  const size_t meta_size = sizeof(CompactHeader) + m.comm.size() + m.signature.size();
  if (meta_size > kMaxHeader || meta_size + body.size() > kChunk) return std::nullopt;
  SendCache* cache = ThreadCache<SendCache>::get();
  std::shared_ptr<Peer> hold;
  Peer* p = cached(cache, peer, hold);
  if (p->lost.load(std::memory_order_acquire) || !p->compact_ok.load(std::memory_order_acquire) ||
      p->out_state.load(std::memory_order_acquire) != OutState::kStarted) {
    return std::nullopt;
  }
  std::string exiting;
  std::string& meta = cache != nullptr ? cache->meta : exiting;
  meta.resize(meta_size);
  const CompactHeader h{static_cast<uint32_t>(m.comm.size()),
                        static_cast<uint32_t>(m.signature.size()),
                        static_cast<uint32_t>(m.source),
                        static_cast<uint32_t>(m.dest),
                        m.tag,
                        m.sequence,
                        m.collective ? 1u : 0u,
                        0};
  char* at = meta.data();
  std::memcpy(at, &h, sizeof h);
  if (!m.comm.empty()) std::memcpy(at + sizeof h, m.comm.data(), m.comm.size());
  if (!m.signature.empty()) std::memcpy(at + sizeof h + m.comm.size(), m.signature.data(), m.signature.size());
  return send_started(*p, Outgoing(kCompact, meta, body));
}

absl::Status Links::send_started(Peer& p, Outgoing out) {
  if (out.header.size() > kMaxHeader) {
    return absl::InvalidArgumentError(absl::StrCat("a collectives frame header of ", out.header.size(), " bytes"));
  }
  // Counted when handed to the ring (written now or queued behind others).
  g_shm_bytes_out.fetch_add(out.body.size(), std::memory_order_relaxed);
  auto gone = [&p] {
    return absl::UnavailableError(absl::StrCat("proc ", p.id, " is gone (its shared-memory link is down)"));
  };
  if (t_progress_context) {
    // Never wait here: write if the ring takes it now and nothing is queued
    // before it, else queue it (with its own copy of the body).
    if (!p.producing.test_and_set(std::memory_order_acquire)) {
      bool sent = flush_backlog(p) && write_some(*p.outbound, out);
      if (sent) {
        p.producing.clear(std::memory_order_release);
        g_frames_out.fetch_add(1, std::memory_order_relaxed);
        return absl::OkStatus();
      }
      // A partly written frame stays at the front: nothing may pass it.
      detail::MutexLock lock(p.backlog_mu);
      const bool front = out.started;
      queue_owned(p.backlog, std::move(out), front);
      p.has_backlog.store(true, std::memory_order_release);
      p.producing.clear(std::memory_order_release);
    } else {
      detail::MutexLock lock(p.backlog_mu);
      queue_owned(p.backlog, std::move(out), /*front=*/false);
      p.has_backlog.store(true, std::memory_order_release);
    }
    g_frames_out.fetch_add(1, std::memory_order_relaxed);
    p.wake_drain();
    return absl::OkStatus();
  }
  detail::MutexLock lock(p.send_mu);
  // Hold the ring from the first record to the last: a frame in parts must
  // not be interleaved with another. Progress contexts queue meanwhile.
  while (p.producing.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
  absl::Duration nap = absl::Microseconds(1);
  while (!(flush_backlog(p) && write_some(*p.outbound, out))) {
    if (p.lost.load(std::memory_order_acquire)) {
      p.producing.clear(std::memory_order_release);
      return gone();
    }
    // Full: the consumer's progress thread (or a waiter) empties it. Back off politely.
    // Meanwhile read our own rings: this thread may hold them polled
    // (ShmPollScope), and the peer may be waiting for space in one of them.
    Links::instance().poll();
    if (nap < absl::Microseconds(50)) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(nap);
    }
    nap = std::min(nap * 2, absl::Microseconds(500));
  }
  p.producing.clear(std::memory_order_release);
  g_frames_out.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

bool Links::flush_backlog(Peer& p) {
  if (!p.has_backlog.load(std::memory_order_acquire)) return true;
  detail::MutexLock lock(p.backlog_mu);
  while (!p.backlog.empty()) {
    if (!write_some(*p.outbound, p.backlog.front())) return false;
    p.backlog.pop_front();
  }
  p.has_backlog.store(false, std::memory_order_release);
  return true;
}

Links::Consumed Links::consume(Peer& p) {
  if (!p.inbound_started.load(std::memory_order_acquire) || p.lost.load(std::memory_order_acquire) ||
      p.broken.load(std::memory_order_acquire)) {
    return Consumed::kNothing;
  }
  // An empty ring costs a waiter's look two loads, not a locked exchange
  // (several looks per wait, one per ring).
  if (!p.inbound->readable()) return Consumed::kNothing;
  if (p.consuming.test_and_set(std::memory_order_acquire)) return Consumed::kBusy;
  ProgressContext progress;
  bool any = false;
  absl::Status broken;
  for (int n = 0; n < 64; ++n) {
    absl::StatusOr<std::optional<ShmRing::Record>> rec = p.inbound->peek();
    if (!rec.ok()) {
      broken = rec.status();
      break;
    }
    if (!rec->has_value()) break;
    const ShmRing::Record& r = **rec;
    any = true;
    if (r.kind == kCompact) {
      CompactHeader h;
      if (r.meta.size() < sizeof h) {
        broken = absl::DataLossError(absl::StrCat("shared-memory link from proc ", p.id, ": a short compact record"));
        break;
      }
      std::memcpy(&h, r.meta.data(), sizeof h);
      if (uint64_t{h.comm_size} + h.signature_size != r.meta.size() - sizeof h || h.collective > 1) {
        broken = absl::DataLossError(absl::StrCat("shared-memory link from proc ", p.id, ": a malformed compact record"));
        break;
      }
      CompactMessage m;
      m.comm = r.meta.substr(sizeof h, h.comm_size);
      m.signature = r.meta.substr(sizeof h + h.comm_size);
      m.source = static_cast<int>(h.source);
      m.dest = static_cast<int>(h.dest);
      m.collective = h.collective == 1;
      m.tag = h.tag;
      m.sequence = h.sequence;
      Exchange::instance().on_compact(m, r.body.data(), r.body.size());
      g_frames_in.fetch_add(1, std::memory_order_relaxed);
      if (t_drain_thread) g_frames_by_drain.fetch_add(1, std::memory_order_relaxed);
    } else if (r.kind == kFrame) {
      Exchange::instance().on_frame(p.host, p.id, r.meta, r.body.data(), r.body.size(), {});
      g_frames_in.fetch_add(1, std::memory_order_relaxed);
      if (t_drain_thread) g_frames_by_drain.fetch_add(1, std::memory_order_relaxed);
    } else if (r.kind == kFirstPart && r.meta.size() >= 8) {
      std::memcpy(&p.part_total, r.meta.data(), 8);
      p.part_header.assign(r.meta.substr(8));
      p.part_body.clear();
      p.part_body.reserve(p.part_total);
      p.part_body.append(r.body);
    } else if (r.kind == kMorePart && p.part_body.size() + r.body.size() <= p.part_total) {
      p.part_body.append(r.body);
    } else {
      broken = absl::DataLossError(absl::StrCat("shared-memory link from proc ", p.id, ": unexpected record kind ",
                                                r.kind));
      break;
    }
    if ((r.kind == kFirstPart || r.kind == kMorePart) && p.part_body.size() == p.part_total) {
      wire::Payload owner = wire::Payload::adopt(std::move(p.part_body));
      const char* data = owner.data();
      const size_t size = owner.size();
      Exchange::instance().on_frame(p.host, p.id, p.part_header, data, size, std::move(owner));
      p.part_body = std::string();
      g_frames_in.fetch_add(1, std::memory_order_relaxed);
      if (t_drain_thread) g_frames_by_drain.fetch_add(1, std::memory_order_relaxed);
    }
    p.inbound->pop();
  }
  p.consuming.clear(std::memory_order_release);
  if (!broken.ok()) {
    p.broken.store(true, std::memory_order_release);
    CASTMESH_LOG_ERROR("castmesh-collectives: {}; treating proc {} as lost", std::string(broken.message()), p.id);
    Exchange::instance().on_peer_lost(p.id, broken);
  }
  return any ? Consumed::kHandled : Consumed::kNothing;
}

bool Links::poll() {
  bool any = false;
  // The snapshot must outlive the loop: in `for (... : *readers())` the
  // shared_ptr temporary dies before the first iteration, so a lost peer's
  // new list could free the vector being read (TSan caught it).
  const std::shared_ptr<const std::vector<std::shared_ptr<Peer>>> peers = readers();
  for (const auto& p : *peers) any |= consume(*p) == Consumed::kHandled;
  return any;
}

// A waiting caller's wait on the rings (progress::WaitSource): it spins on
// its inbound rings under the engine's wait policy, counted as their poller
// for the whole wait, asleep or not (producers then never ring the progress
// thread for these rings, which leaves their records to this thread:
// core/shm_link/shm_ring.h), then sleeps on every ring's waiter bell and its
// request's word at once (sleep()).
class RingWaits : public progress::WaitSource {
 public:
  bool begin_wait(size_t& local_peers) override {
    if (t_state.inside) return false;
    std::shared_ptr<const std::vector<std::shared_ptr<Peer>>> peers = Links::instance().readers();
    if (peers->empty()) return false;
    local_peers = peers->size();
    t_state.inside = true;
    t_state.peers = std::move(peers);
    return true;
  }
  absl::Duration spin_budget(bool oversubscribed) override { return wait_spin(oversubscribed); }
  void start_spin() override {
    // The awaited record was not there at the first look: count as a poller
    // now (two writes to lines the peers' producers read, so not before).
    for (const auto& p : *t_state.peers) p->inbound->start_polling();
    t_state.polling = true;
  }
  Look look() override {
    Look result;
    for (const auto& p : *t_state.peers) {
      const Links::Consumed c = Links::instance().consume(*p);
      result.handled |= c == Links::Consumed::kHandled;
      result.busy |= c == Links::Consumed::kBusy;
    }
    return result;
  }
  bool sleep(detail::RequestState& request, absl::Time deadline) override {
    if (t_state.peers->size() >= detail::kFutexWaitAnyMax || !waiter_sleep_enabled()) return false;
    return Links::instance().sleep(request, *t_state.peers, deadline);
  }
  void end_wait() override {
    if (t_state.polling) {
      for (const auto& p : *t_state.peers) p->inbound->stop_polling();
      Links::instance().poll();  // a record published while we spun may not have rung anybody
    }
    t_state = State{};
  }

 private:
  struct State {
    bool inside = false;
    bool polling = false;
    std::shared_ptr<const std::vector<std::shared_ptr<Peer>>> peers;
  };
  static thread_local State t_state;
};
thread_local RingWaits::State RingWaits::t_state;

bool Links::sleep(detail::RequestState& request, const std::vector<std::shared_ptr<Peer>>& peers,
                  absl::Time deadline) {
  // One wake-up per message: this thread sleeps on every ring's waiter bell
  // and on the request's own word (complete() from any other path: the
  // socket, this process, a lost peer) at once, and reads the rings itself
  // when woken; the progress thread stays asleep.
  std::vector<detail::FutexWaitItem> items(peers.size() + 1);
  detail::Scheduler::BlockingScope blocking;  // a pooled actor hands its queued work on
  auto look = [&] {
    bool any = false;
    for (const auto& p : peers) any |= consume(*p) == Consumed::kHandled;
    return any;
  };
  while (!request.done()) {
    if (absl::Now() >= deadline) return true;
    request.add_sleeper();
    for (size_t i = 0; i < peers.size(); ++i) {
      items[i] = {peers[i]->inbound->waiter_bell(), peers[i]->inbound->arm_waiter(), /*shared=*/true};
    }
    items[peers.size()] = {request.done_word(), 0, /*shared=*/false};
    // Armed: a record published from here on wakes us; one published before
    // is read now.
    bool ready = false;
    for (const auto& p : peers) ready |= p->inbound->readable();
    detail::FutexWaitAny slept = detail::FutexWaitAny::kWoken;
    if (!ready && !request.done()) {
      // Bounded, so a ring that came up meanwhile (not in `peers`) is waited
      // on at the next wait at the latest.
      slept = detail::futex_wait_any(items.data(), static_cast<int>(items.size()),
                                     std::min(deadline, absl::Now() + absl::Milliseconds(50)));
      if (slept != detail::FutexWaitAny::kUnsupported) g_waiter_sleeps.fetch_add(1, std::memory_order_relaxed);
    }
    for (const auto& p : peers) p->inbound->disarm_waiter();
    request.remove_sleeper();
    if (slept == detail::FutexWaitAny::kUnsupported) return false;
    // Read what came (another thread may hold a ring: it hands its records
    // on itself).
    while (!request.done() && look()) {
    }
  }
  return true;
}

// What no waiting caller reads, on the engine's progress thread: records
// that arrive while no thread of this process waits (unexpected messages,
// ranks busy elsewhere) and the sends that progress contexts queued when a
// ring was full. Its thread sleeps on every served ring's doorbell at once.
class RingDrain : public progress::BackgroundSource {
 public:
  bool run_once() override {
    ShmProgressScope progress;
    t_drain_thread = true;
    busy_ring_ = false;
    bool did = false;
    const auto peers = Links::instance().drains();
    for (const auto& p : *peers) {
      if (p->lost.load(std::memory_order_acquire)) continue;
      // Queued sends first, even while a waiter holds the ring: it may sleep
      // there for long, and the peer may be waiting for them.
      if (p->has_backlog.load(std::memory_order_acquire) && !p->producing.test_and_set(std::memory_order_acquire)) {
        did |= Links::flush_backlog(*p);
        p->producing.clear(std::memory_order_release);
      }
      // A waiting thread spins on the ring: leave the records to it (it looks
      // once more when it stops). Taking them would make it wait for this
      // thread, which may not have a core.
      if (!p->inbound_started.load(std::memory_order_acquire) || p->inbound->polled()) continue;
      const Links::Consumed c = Links::instance().consume(*p);
      did |= c == Links::Consumed::kHandled;
      busy_ring_ |= c == Links::Consumed::kBusy;
    }
    t_drain_thread = false;
    return did;
  }

  bool arm(std::vector<detail::FutexWaitItem>& items, absl::Duration& nap) override {
    armed_ = Links::instance().drains();
    bool ready = false;
    // A waiting thread just stopped spinning and reads the ring: look again soon.
    if (busy_ring_) nap = std::min(nap, absl::Microseconds(20));
    for (const auto& p : *armed_) {
      if (p->lost.load(std::memory_order_acquire)) continue;
      if (p->has_backlog.load(std::memory_order_acquire)) nap = std::min(nap, absl::Microseconds(200));
      if (!p->inbound_started.load(std::memory_order_acquire)) continue;
      if (items.size() >= static_cast<size_t>(detail::kFutexWaitAnyMax)) {
        nap = std::min(nap, absl::Milliseconds(1));  // more rings than one sleep can watch
        continue;
      }
      if (p->inbound->polled()) {
        // Unannounced: producers do not ring for it, so records that land
        // between two waits of a thread that waits again and again cost no
        // wake-up (its next wait reads them; measured, 1 KiB allreduce loop at
        // -n 2: 1,200-4,700 rings per 6,467 records, and this thread handed on
        // 9-48% of them, when the nap was announced); what it leaves unread is
        // taken here when the nap ends.
        items.push_back(detail::FutexWaitItem{p->inbound->doorbell(), p->inbound->doorbell()->load(), true});
        nap = std::min(nap, absl::Milliseconds(5));
        continue;
      }
      items.push_back(detail::FutexWaitItem{p->inbound->doorbell(), p->inbound->arm_sleeper(), true});
      p->drain_armed = true;
      ready |= p->inbound->readable();
    }
    return ready;
  }

  void disarm() override {
    if (armed_ == nullptr) return;
    for (const auto& p : *armed_) {
      if (p->drain_armed) p->inbound->disarm_sleeper();
      p->drain_armed = false;
    }
    armed_.reset();
  }

 private:
  bool busy_ring_ = false;  // a ring another thread held in the last round
  std::shared_ptr<const std::vector<std::shared_ptr<Peer>>> armed_;
};

void Links::start_drain(const std::shared_ptr<Peer>& p) {
  static RingWaits* waits = [] {
    auto* made = new RingWaits;  // leaked with the engine that calls it
    progress::ProgressEngine::instance().add_wait_source(made, /*rank=*/0);
    return made;
  }();
  static RingDrain* drain = [] {
    auto* made = new RingDrain;
    progress::ProgressEngine::instance().add_background_source(made);
    return made;
  }();
  (void)waits;
  (void)drain;
  if (!p->drain_started.exchange(true)) {
    detail::MutexLock lock(mu_);
    drains_ = with_peer(*drains_, p);
  }
  progress::ProgressEngine::instance().wake_background();
}

void Links::on_link_frame(proc::ProcHost& host, const ProcId& peer,
                          const v1::CollectiveHeader& h) {
  switch (h.channel()) {
    case v1::CollectiveHeader::CHANNEL_LINK_OFFER:
      return on_offer(host, peer, h.link());
    case v1::CollectiveHeader::CHANNEL_LINK_ACCEPT:
      return on_accept(host, peer, h);
    case v1::CollectiveHeader::CHANNEL_LINK_START:
      return on_start(peer);
    default:
      return;
  }
}

// The handshake runs on the delivering host's I/O thread, with the host
// itself (not a reference of our own: the I/O thread must never end up
// holding the last one).
void Links::on_offer(proc::ProcHost& host, const ProcId& peer, const std::string& name) {
  std::string error;
  if (!enabled()) {
    error = "CASTMESH_SHM=0 on the receiver";
  } else {
    absl::StatusOr<std::unique_ptr<ShmRing>> ring = ShmRing::Open(name);
    std::shared_ptr<Peer> p = get(peer);
    if (!ring.ok()) {
      error = std::string(std::string(ring.status().message()));
    } else if (p->inbound != nullptr || p->lost.load()) {
      error = "a link from this proc is already up";
    } else {
      (*ring)->unlink();  // both sides have it mapped now (the sender unlinks too)
      p->host = host.weak_from_this();
      p->inbound = *std::move(ring);
    }
  }
  if (!error.empty()) {
    CASTMESH_LOG_INFO("castmesh-collectives: refusing the shared-memory link offered by {}: {}", peer, error);
  }
  v1::CollectiveHeader answer;
  answer.set_channel(v1::CollectiveHeader::CHANNEL_LINK_ACCEPT);
  answer.set_signature(error);
  if (error.empty()) answer.set_link_features(kFeatureCompact);
  (void)link_send(host, peer, answer);
}

void Links::on_accept(proc::ProcHost& host, const ProcId& peer, const v1::CollectiveHeader& h) {
  const std::string& error = h.signature();
  std::shared_ptr<Peer> p = find(peer);
  if (p == nullptr) return;
  detail::MutexLock lock(p->send_mu);
  if (p->out_state.load() != OutState::kOffered) return;
  p->outbound->unlink();
  if (!error.empty()) {
    CASTMESH_LOG_INFO("castmesh-collectives: proc {} refused the shared-memory link ({}); frames to it go over the "
                      "socket",
                      peer, error);
    p->outbound.reset();
    p->out_state.store(OutState::kRefused);
    return;
  }
  v1::CollectiveHeader start;
  start.set_channel(v1::CollectiveHeader::CHANNEL_LINK_START);
  if (!link_send(host, peer, start).ok()) {
    p->outbound.reset();
    p->out_state.store(OutState::kRefused);
    return;
  }
  p->compact_ok.store((h.link_features() & kFeatureCompact) != 0, std::memory_order_release);
  p->out_state.store(OutState::kStarted, std::memory_order_release);
  start_drain(p);  // flushes what progress contexts queue
}

void Links::on_start(const ProcId& peer) {
  std::shared_ptr<Peer> p = find(peer);
  if (p == nullptr || p->inbound == nullptr || p->inbound_started.load()) return;
  p->inbound_started.store(true, std::memory_order_release);
  {
    detail::MutexLock lock(mu_);
    readers_ = with_peer(*readers_, p);
  }
  start_drain(p);  // the progress thread now sleeps on its doorbell too
}

void Links::on_peer_lost(const ProcId& peer, const absl::Status&) {
  std::shared_ptr<Peer> p = find(peer);
  if (p == nullptr || p->lost.load()) return;
  // What the peer wrote before it died is still valid: hand it on first.
  if (p->inbound_started.load(std::memory_order_acquire)) {
    while (p->consuming.test(std::memory_order_acquire)) std::this_thread::yield();
    while (consume(*p) == Consumed::kHandled) {
    }
  }
  p->lost.store(true, std::memory_order_release);
  {
    detail::MutexLock lock(mu_);
    readers_ = without_peer(*readers_, p);
    drains_ = without_peer(*drains_, p);
  }
  {
    detail::MutexLock lock(p->backlog_mu);
    p->backlog.clear();
    p->has_backlog.store(false);
  }
  p->wake_drain();
  // A sender blocked on the full ring sees `lost` and lets go of send_mu.
  detail::MutexLock lock(p->send_mu);
  if (p->outbound != nullptr) p->outbound->unlink();  // it may never have mapped it
}

void Links::on_peer_alive(const ProcId& peer) {
  detail::MutexLock lock(mu_);
  auto it = peers_.find(peer);
  if (it != peers_.end() && it->second->lost.load()) peers_.erase(it);
}

std::shared_ptr<const std::vector<std::shared_ptr<Peer>>> Links::hold_polled() {
  auto peers = readers();
  for (const auto& p : *peers) p->inbound->start_polling();
  return peers;
}

void Links::release_polled(const std::vector<std::shared_ptr<Peer>>& peers) {
  for (const auto& p : peers) p->inbound->stop_polling();
  poll();  // a record published while the rings were held rang nobody
}

ShmPathStats Links::stats() {
  ShmPathStats s;
  s.frames_in = g_frames_in.load();
  s.frames_out = g_frames_out.load();
  s.waiter_sleeps = g_waiter_sleeps.load();
  s.frames_by_drain = g_frames_by_drain.load();
  s.shm_bytes_out = g_shm_bytes_out.load();
  s.socket_bytes_out = g_socket_bytes_out.load();
  detail::MutexLock lock(mu_);
  for (const auto& [id, p] : peers_) {
    if (p->lost.load()) continue;
    s.links_in += p->inbound_started.load() ? 1 : 0;
    s.links_out += p->out_state.load() == OutState::kStarted ? 1 : 0;
  }
  return s;
}

}  // namespace

absl::Status send_collective_frame(proc::ProcHost& host, const ProcId& peer, std::string_view header,
                                   std::string_view body, std::shared_ptr<const void> body_owner) {
  return Links::instance().send(host, peer, header, body, std::move(body_owner));
}

std::optional<absl::Status> try_send_compact(const ProcId& peer, const CompactMessage& message,
                                             std::string_view body) {
  return Links::instance().try_send_compact(peer, message, body);
}

void on_shm_link_frame(proc::ProcHost& host, const ProcId& peer,
                       const v1::CollectiveHeader& header) {
  ProgressContext progress;
  Links::instance().on_link_frame(host, peer, header);
}

void on_shm_peer_lost(const ProcId& peer, const absl::Status& why) { Links::instance().on_peer_lost(peer, why); }

void on_shm_peer_alive(const ProcId& peer) { Links::instance().on_peer_alive(peer); }

ShmProgressScope::ShmProgressScope() : saved_(t_progress_context) { t_progress_context = true; }
ShmProgressScope::~ShmProgressScope() { t_progress_context = saved_; }

ShmPollScope::ShmPollScope() : rings_(Links::instance().hold_polled()) {}
ShmPollScope::~ShmPollScope() {
  Links::instance().release_polled(*std::static_pointer_cast<const std::vector<std::shared_ptr<Peer>>>(rings_));
}

ShmPathStats shm_path_stats() { return Links::instance().stats(); }

bool shm_link_started(const ProcId& peer) { return Links::instance().started(peer); }

}  // namespace castmesh::collectives
