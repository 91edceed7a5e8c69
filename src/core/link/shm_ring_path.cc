#include "core/link/shm_ring_path.h"

#include <thread>

#include "castmesh/wire/v1/collectives.pb.h"
#include "core/link/receiver.h"
#include "core/link/shm_ring_internal.h"
#include "core/log/log.h"
#include "core/proc/proc_host.h"

namespace castmesh::link::shm_ring {

thread_local bool t_progress_context = false;
thread_local bool t_drain_thread = false;
std::atomic<uint64_t> g_frames_in{0}, g_frames_out{0}, g_waiter_sleeps{0}, g_frames_by_drain{0};
std::atomic<uint64_t> g_shm_bytes_out{0}, g_socket_bytes_out{0};

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

std::shared_ptr<const shm_ring::PeerList> Links::readers() {
  detail::MutexLock lock(mu_);
  return readers_;
}

std::shared_ptr<const shm_ring::PeerList> Links::drains() {
  detail::MutexLock lock(mu_);
  return drains_;
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
    CASTMESH_LOG_INFO("castmesh-link: refusing the shared-memory link offered by {}: {}", peer, error);
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
    CASTMESH_LOG_INFO("castmesh-link: proc {} refused the shared-memory link ({}); frames to it go over the "
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

}  // namespace castmesh::link::shm_ring

namespace castmesh::link {
using shm_ring::Links;
using shm_ring::ProgressContext;

absl::Status send_collective_frame(proc::ProcHost& host, const ProcId& peer, std::string_view header,
                                   std::string_view body, std::shared_ptr<const void> body_owner) {
  return Links::instance().send(host, peer, header, body, std::move(body_owner));
}

std::optional<absl::Status> try_send_compact(const ProcId& peer, const Envelope& message,
                                             std::string_view body) {
  return Links::instance().try_send_compact(peer, message, body);
}

void on_shm_link_frame(proc::ProcHost& host, const ProcId& peer, const wire::v1::CollectiveHeader& header) {
  ProgressContext progress;
  Links::instance().on_link_frame(host, peer, header);
}

void on_shm_peer_lost(const ProcId& peer, const absl::Status& why) { Links::instance().on_peer_lost(peer, why); }

void on_shm_peer_alive(const ProcId& peer) { Links::instance().on_peer_alive(peer); }

ShmProgressScope::ShmProgressScope() : saved_(shm_ring::t_progress_context) { shm_ring::t_progress_context = true; }
ShmProgressScope::~ShmProgressScope() { shm_ring::t_progress_context = saved_; }

ShmPollScope::ShmPollScope() : rings_(Links::instance().hold_polled()) {}
ShmPollScope::~ShmPollScope() {
  Links::instance().release_polled(*std::static_pointer_cast<const shm_ring::PeerList>(rings_));
}

ShmPathStats shm_path_stats() { return Links::instance().stats(); }

bool shm_link_started(const ProcId& peer) { return Links::instance().started(peer); }

}  // namespace castmesh::link
