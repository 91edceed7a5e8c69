// Writing frames into a peer's ring: the switch-over from the socket, compact
// records, frames in parts, and back-pressure (a caller waits for space, a
// progress context queues). shm_ring_path.h describes the path.
#include "core/link/shm_ring_internal.h"

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "castmesh/wire/v1/collectives.pb.h"
#include "core/link/receiver.h"
#include "core/log/log.h"
#include "core/platform/process_memory.h"
#include "core/platform/thread_cache.h"
#include "core/proc/proc_host.h"

namespace castmesh::link::shm_ring {

namespace {

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

}  // namespace

// A link handshake frame (CHANNEL_LINK_*): always over the socket, as its own type.
absl::Status link_send(proc::ProcHost& host, const ProcId& peer, const v1::CollectiveHeader& header) {
  return host.send_data(peer, kCollectiveLinkDataType, header.SerializeAsString());
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
    CASTMESH_LOG_INFO("castmesh-link: no shared-memory link to {} ({}); its frames go over the socket", p.id,
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

std::optional<absl::Status> Links::try_send_compact(const ProcId& peer, const Envelope& m,
                                                    std::string_view body) {
  if (t_progress_context || !enabled()) return std::nullopt;
  const size_t meta_size = sizeof(CompactHeader) + m.comm.size() + m.signature.size();
  if (meta_size > kMaxHeader || meta_size + body.size() > kChunk) return std::nullopt;
  SendCache* cache = platform::ThreadCache<SendCache>::get();
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

}  // namespace castmesh::link::shm_ring
