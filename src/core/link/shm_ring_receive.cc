// Reading a peer's ring: records (whole frames, frames in parts, compact
// records) go to the receiver (receiver.h) like socket frames.
#include "core/link/shm_ring_internal.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/link/receiver.h"
#include "core/log/log.h"

namespace castmesh::link::shm_ring {

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
      Envelope m;
      m.comm = r.meta.substr(sizeof h, h.comm_size);
      m.signature = r.meta.substr(sizeof h + h.comm_size);
      m.source = static_cast<int>(h.source);
      m.dest = static_cast<int>(h.dest);
      m.collective = h.collective == 1;
      m.tag = h.tag;
      m.sequence = h.sequence;
      receiver().on_compact(m, r.body.data(), r.body.size());
      g_frames_in.fetch_add(1, std::memory_order_relaxed);
      if (t_drain_thread) g_frames_by_drain.fetch_add(1, std::memory_order_relaxed);
    } else if (r.kind == kFrame) {
      receiver().on_frame(p.host, p.id, r.meta, r.body.data(), r.body.size(), {});
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
      receiver().on_frame(p.host, p.id, p.part_header, data, size, std::move(owner));
      p.part_body = std::string();
      g_frames_in.fetch_add(1, std::memory_order_relaxed);
      if (t_drain_thread) g_frames_by_drain.fetch_add(1, std::memory_order_relaxed);
    }
    p.inbound->pop();
  }
  p.consuming.clear(std::memory_order_release);
  if (!broken.ok()) {
    p.broken.store(true, std::memory_order_release);
    CASTMESH_LOG_ERROR("castmesh-link: {}; treating proc {} as lost", std::string(broken.message()), p.id);
    receiver().on_peer_lost(p.id, broken);
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

}  // namespace castmesh::link::shm_ring
