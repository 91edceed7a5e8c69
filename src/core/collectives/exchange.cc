#include "core/collectives/exchange.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/wire/v1/collectives.pb.h"
#include "core/collectives/comm_group.h"
#include "core/collectives/socket_wait.h"
#include "core/link/shm_ring_path.h"
#include "core/link/single_copy_link.h"
#include "core/log/log.h"
#include "core/platform/thread_cache.h"
#include "core/proc/proc_host.h"
#include "core/wire/frame.h"

namespace castmesh::collectives {
namespace {

namespace v1 = wire::v1;

// The "collectives" proc service: frames and lost peers of one ProcHost
// go to the process's Exchange.
class CollectivesService final : public proc::ProcService {
 public:
  explicit CollectivesService(proc::ProcHost& host) : id_(host.id()) {
    std::weak_ptr<proc::ProcHost> weak = host.shared_from_this();
    proc::ProcHost* raw = &host;  // handlers run on its I/O thread, while it lives
    host.on_data(kCollectiveDataType, [weak, raw](const ProcId& peer, std::string_view header, wire::Payload payload) {
      link::ShmProgressScope io_thread;  // replies it sends must not wait for ring space
      Exchange::instance().on_frame(weak, peer, header, std::move(payload), *raw);
    });
    host.on_data(kCollectiveLinkDataType, [raw](const ProcId& peer, std::string_view header, wire::Payload) {
      v1::CollectiveHeader handshake;
      if (!wire::parse_message(header, handshake) || handshake.channel() < v1::CollectiveHeader::CHANNEL_LINK_OFFER) {
        CASTMESH_LOG_WARN("castmesh-collectives: dropping a malformed link frame from {}", peer);
        return;
      }
      link::ShmProgressScope io_thread;
      link::on_shm_link_frame(*raw, peer, handshake);
    });
    // Bodies of frames whose receive is already posted land in its buffer.
    host.on_data_sink(kCollectiveDataType, [](const ProcId& peer, std::string_view header, uint64_t size) {
      return Exchange::instance().sink_for_frame(peer, header, size);
    });
    observer_ = host.add_peer_lost_observer(
        [](const ProcId& peer, const absl::Status& why) { Exchange::instance().on_peer_lost(peer, why); });
  }
  void detach() override {}

 private:
  ProcId id_;
  uint64_t observer_ = 0;
};

[[maybe_unused]] const bool kRegistered = [] {
  proc::register_proc_service("collectives", [](proc::ProcHost& host) -> std::shared_ptr<proc::ProcService> {
    return std::make_shared<CollectivesService>(host);
  });
  return true;
}();

// The links below the collectives deliver into the Exchange through this
// seam (core/link/receiver.h), registered when the library loads.
class ExchangeReceiver final : public link::Receiver {
 public:
  void on_compact(const link::Envelope& message, const char* body, size_t size) override {
    Exchange::instance().on_compact(message, body, size);
  }
  void on_frame(const std::weak_ptr<proc::ProcHost>& host, const ProcId& peer, std::string_view header,
                const char* body, size_t size, wire::Payload owner) override {
    Exchange::instance().on_frame(host, peer, header, body, size, std::move(owner));
  }
  void abort_collective(std::string_view comm, int dest, uint64_t sequence, const absl::Status& why) override {
    Exchange::instance().mailbox(std::string(comm), dest)->abort_collective(sequence, why);
  }
  void on_peer_lost(const ProcId& peer, const absl::Status& why) override {
    Exchange::instance().on_peer_lost(peer, why);
  }
};

[[maybe_unused]] const bool kReceiverRegistered = [] {
  static auto* receiver = new ExchangeReceiver;  // leaked: links deliver until the process ends
  link::set_receiver(receiver);
  return true;
}();

}  // namespace

Exchange& Exchange::instance() {
  static auto* exchange = new Exchange;  // leaked: I/O threads may deliver during exit
  return *exchange;
}

Exchange::Entry& Exchange::entry(const std::string& comm, int rank) {
  Entry& e = entries_[std::make_pair(comm, rank)];
  if (!e.mailbox) e.mailbox = std::make_shared<RankMailbox>();
  return e;
}

std::shared_ptr<RankMailbox> Exchange::mailbox(const std::string& comm, int rank) {
  detail::MutexLock lock(mu_);
  return entry(comm, rank).mailbox;
}

std::shared_ptr<detail::CommGroup> Exchange::group(const std::string& comm, int rank, bool pin,
                                                   const std::function<std::shared_ptr<detail::CommGroup>()>& make) {
  {
    detail::MutexLock lock(mu_);
    if (auto live = entry(comm, rank).group.lock()) return live;
  }
  std::shared_ptr<detail::CommGroup> made = make();  // may call watch()/mailbox(): no lock held
  detail::MutexLock lock(mu_);
  Entry& e = entry(comm, rank);
  if (auto live = e.group.lock()) return live;  // another thread won
  e.group = made;
  if (pin) e.pinned = made;
  return made;
}

void Exchange::watch(const std::string& comm, int rank, std::vector<ProcId> procs, std::string description) {
  std::vector<std::pair<int, absl::Status>> already_lost;
  std::shared_ptr<RankMailbox> box;
  {
    detail::MutexLock lock(mu_);
    Entry& e = entry(comm, rank);
    e.procs = std::move(procs);
    e.description = std::move(description);
    box = e.mailbox;
    for (size_t r = 0; r < e.procs.size(); ++r) {
      if (auto it = lost_.find(e.procs[r]); it != lost_.end()) already_lost.emplace_back(static_cast<int>(r), it->second);
    }
  }
  for (auto& [r, why] : already_lost) box->fail_source(r, why);
}

void Exchange::forget(const std::string& comm, int rank) {
  detail::MutexLock lock(mu_);
  auto it = entries_.find(std::make_pair(comm, rank));
  if (it != entries_.end() && it->second.group.expired()) {
    entries_.erase(it);
    forgotten_.fetch_add(1, std::memory_order_release);
  }
}

void Exchange::unpin(const std::string& id) {
  std::vector<std::shared_ptr<detail::CommGroup>> released;  // destroyed without the lock: ~CommGroup calls forget()
  {
    detail::MutexLock lock(mu_);
    for (auto& [key, e] : entries_) {
      const std::string& comm = key.first;
      const bool of_mesh = comm == id || (comm.size() > id.size() && comm.starts_with(id) && comm[id.size()] == '/');
      if (of_mesh && e.pinned) released.push_back(std::move(e.pinned));
    }
  }
}

size_t Exchange::live_groups() {
  detail::MutexLock lock(mu_);
  return static_cast<size_t>(
      std::count_if(entries_.begin(), entries_.end(), [](const auto& kv) { return !kv.second.group.expired(); }));
}

namespace {
struct CachedMailbox {
  std::string comm;
  int rank;
  std::shared_ptr<RankMailbox> box;
};
struct MailboxCache {
  std::vector<CachedMailbox> entries;
  uint64_t seen = 0;  // Exchange::forgotten_ when filled
};
}  // namespace

RankMailbox* Exchange::cached_mailbox(std::string_view comm, int rank, std::shared_ptr<RankMailbox>& hold) {
  MailboxCache* cache = platform::ThreadCache<MailboxCache>::get();
  if (cache == nullptr) {
    hold = mailbox(std::string(comm), rank);
    return hold.get();
  }
  if (const uint64_t now = forgotten_.load(std::memory_order_acquire); now != cache->seen) {
    cache->entries.clear();
    cache->seen = now;
  }
  for (const CachedMailbox& c : cache->entries) {
    if (c.rank == rank && c.comm == comm) return c.box.get();
  }
  std::string key(comm);
  std::shared_ptr<RankMailbox> box = mailbox(key, rank);
  if (cache->entries.size() >= 16) cache->entries.erase(cache->entries.begin());
  cache->entries.push_back(CachedMailbox{std::move(key), rank, box});
  return box.get();
}

void Exchange::on_compact(const CompactMessage& m, const char* body, size_t size) {
  const Channel channel = m.collective ? Channel::kCollective : Channel::kP2P;
  std::shared_ptr<RankMailbox> hold;
  cached_mailbox(m.comm, m.dest, hold)
      ->deliver_view(channel, m.source, m.tag, m.signature, body, size);
}

namespace {

// A message whose body is still in the sender's memory on this host: the
// single-copy link reads it (link::SingleCopyOffer) when a receive matches.
class SingleCopyBody final : public RemoteBody {
 public:
  explicit SingleCopyBody(link::SingleCopyOffer offer) : offer_(std::move(offer)) {}

  size_t size() const override { return offer_.size(); }

  void deliver(const PostedRecv& recv, const MessageKey& key, const absl::Status& error) const override {
    if (!error.ok()) {
      recv.request->complete(error);
      return offer_.answer(false);
    }
    const absl::Status read = offer_.read_into(recv.buffer);
    if (read.ok()) {
      recv.request->complete(
          MessageStatus{key.source, key.channel == Channel::kP2P ? static_cast<int>(key.tag) : 0, offer_.size()});
      return offer_.answer(false);
    }
    if (absl::IsUnavailable(read)) {  // the sender is gone; its loss fails the rest
      recv.request->complete(
          absl::UnavailableError(absl::StrCat("rank ", offer_.sender(), " is gone: ", read.message())));
      return;
    }
    Exchange::instance().park(offer_.peer(), offer_.token(), recv, key);
    offer_.answer(true);
  }

 private:
  const link::SingleCopyOffer offer_;
};

}  // namespace

std::shared_ptr<detail::CommGroup> Exchange::live_group(const std::string& comm, int rank) {
  detail::MutexLock lock(mu_);
  auto it = entries_.find(std::make_pair(comm, rank));
  return it == entries_.end() ? nullptr : it->second.group.lock();
}

void Exchange::park(const ProcId& peer, uint64_t token, PostedRecv recv, MessageKey key) {
  detail::MutexLock lock(mu_);
  parked_[std::make_pair(peer, token)] = Parked{std::move(recv), std::move(key)};
}

void Exchange::deliver_fallback_body(const ProcId& peer, uint64_t token, const char* body, size_t size) {
  std::optional<Parked> parked;
  {
    detail::MutexLock lock(mu_);
    auto it = parked_.find(std::make_pair(peer, token));
    if (it == parked_.end()) return;
    parked = std::move(it->second);
    parked_.erase(it);
  }
  parked->key.remote = nullptr;
  RankMailbox::fill(parked->recv, parked->key, body, size);
}

void Exchange::on_frame(const std::weak_ptr<proc::ProcHost>& host, const ProcId& peer, std::string_view header_bytes,
                        wire::Payload payload, proc::ProcHost& delivering) {
  const char* body = payload.data();
  const size_t body_size = payload.size();
  on_frame(host, peer, header_bytes, body, body_size, std::move(payload), &delivering);
}

void Exchange::on_frame(const std::weak_ptr<proc::ProcHost>& host, const ProcId& peer, std::string_view header_bytes,
                        const char* body, size_t body_size, wire::Payload payload, proc::ProcHost* delivering) {
  platform::ThreadLoan<v1::CollectiveHeader> loan;  // its fields keep their memory: no allocation per frame
  v1::CollectiveHeader& header = *loan;
  if (!wire::parse_message(header_bytes, header)) {
    CASTMESH_LOG_WARN("castmesh-collectives: dropping a malformed frame from {}", peer);
    return;
  }
  if (header.channel() >= v1::CollectiveHeader::CHANNEL_LINK_OFFER) {
    CASTMESH_LOG_WARN("castmesh-collectives: dropping a link frame from {} sent as a data frame", peer);
    return;
  }
  if (delivering != nullptr) watch_socket_peer(host, peer);  // a socket frame: later ones, the waiter reads
  const int dest = static_cast<int>(header.dest());
  if (header.channel() == v1::CollectiveHeader::CHANNEL_DONE) {
    if (auto group = live_group(header.comm(), dest)) group->on_send_done(header.token(), header.fallback());
    return;
  }
  if (header.fallback_body()) return deliver_fallback_body(peer, header.token(), body, body_size);
  std::shared_ptr<RankMailbox> hold;
  RankMailbox* box = cached_mailbox(header.comm(), dest, hold);
  if (header.channel() == v1::CollectiveHeader::CHANNEL_ABORT) {
    box->abort_collective(header.sequence(), absl::AbortedError(header.signature()));
    return;
  }
  const Channel channel =
      header.channel() == v1::CollectiveHeader::CHANNEL_COLLECTIVE ? Channel::kCollective : Channel::kP2P;
  if (header.token() == 0 && (payload.empty() || payload.borrowed())) {
    // The body is read before this returns anyway (a ring record, a lent
    // socket frame): matched from the header's own fields, nothing copied
    // unless it must wait.
    box->deliver_view(channel, static_cast<int>(header.source()), header.tag(), header.signature(), body, body_size);
    return;
  }
  MessageKey key;
  key.channel = channel;
  key.source = static_cast<int>(header.source());
  key.tag = header.tag();
  key.signature = header.signature();
  if (header.token() != 0) key.remote = std::make_shared<SingleCopyBody>(link::SingleCopyOffer(host, peer, header));
  box->deliver(std::move(key), body, body_size, std::move(payload));
}

std::shared_ptr<transport::PayloadSink> Exchange::sink_for_frame(const ProcId& peer, std::string_view header_bytes,
                                                                uint64_t size) {
  v1::CollectiveHeader header;
  if (!wire::parse_message(header_bytes, header) || header.token() != 0 || header.fallback_body() ||
      (header.channel() != v1::CollectiveHeader::CHANNEL_P2P &&
       header.channel() != v1::CollectiveHeader::CHANNEL_COLLECTIVE)) {
    return nullptr;  // on_frame handles (or drops) it
  }
  MessageKey key;
  key.channel = header.channel() == v1::CollectiveHeader::CHANNEL_COLLECTIVE ? Channel::kCollective : Channel::kP2P;
  key.source = static_cast<int>(header.source());
  key.tag = header.tag();
  key.signature = header.signature();
  return mailbox(header.comm(), static_cast<int>(header.dest()))->sink_for(key, size);
}

void Exchange::on_peer_alive(const ProcId& peer) {
  link::on_shm_peer_alive(peer);
  detail::MutexLock lock(mu_);
  lost_.erase(peer);
}

void Exchange::on_peer_lost(const ProcId& peer, const absl::Status& why) {
  link::on_shm_peer_lost(peer, why);  // first: what the peer wrote to its ring before it died is delivered
  std::vector<std::tuple<std::shared_ptr<RankMailbox>, int, absl::Status>> failed;
  std::vector<std::shared_ptr<detail::CommGroup>> groups;
  std::vector<Parked> parked;
  {
    detail::MutexLock lock(mu_);
    lost_.emplace(peer, why);
    for (auto it = parked_.begin(); it != parked_.end();) {
      if (it->first.first != peer) {
        ++it;
        continue;
      }
      parked.push_back(std::move(it->second));
      parked_.erase(it++);
    }
    for (auto& [key, e] : entries_) {
      if (auto group = e.group.lock()) groups.push_back(std::move(group));
      for (size_t r = 0; r < e.procs.size(); ++r) {
        if (e.procs[r] != peer) continue;
        failed.emplace_back(e.mailbox, static_cast<int>(r),
                            absl::UnavailableError(absl::StrCat("rank ", r, " of the ", e.description, " (proc ", peer,
                                                                ") is gone: ", why.message())));
      }
    }
  }
  for (auto& [box, r, st] : failed) box->fail_source(r, st);
  const absl::Status gone = absl::UnavailableError(absl::StrCat("proc ", peer, " is gone: ", why.message()));
  for (auto& group : groups) group->fail_sends_to(peer, gone);
  for (auto& p : parked) p.recv.request->complete(gone);
}

}  // namespace castmesh::collectives
