#include "core/collectives/exchange.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "castmesh/wire/v1/collectives.pb.h"
#include "core/collectives/comm_group.h"
#include "core/log/log.h"
#include "core/proc/proc_host.h"

namespace castmesh::collectives {
namespace {

namespace v1 = wire::v1;

size_t put_varint32(uint32_t value, char* out) {
  size_t n = 0;
  while (value >= 0x80) {
    out[n++] = static_cast<char>(value | 0x80);
    value >>= 7;
  }
  out[n++] = static_cast<char>(value);
  return n;
}

// Reads a varint32 from [p, end); 0 when malformed.
size_t get_varint32(const char* p, const char* end, uint32_t* value) {
  uint32_t result = 0;
  for (size_t i = 0; i < 5 && p + i < end; ++i) {
    const auto byte = static_cast<uint8_t>(p[i]);
    result |= static_cast<uint32_t>(byte & 0x7f) << (7 * i);
    if ((byte & 0x80) == 0) {
      *value = result;
      return i + 1;
    }
  }
  return 0;
}

// The "collectives" proc service: frames and lost peers of one ProcHost
// go to the process's Exchange.
class CollectivesService final : public proc::ProcService {
 public:
  explicit CollectivesService(proc::ProcHost& host) : id_(host.id()) {
    host.on_data(kCollectiveDataType, [](const ProcId& peer, wire::Payload payload) {
      Exchange::instance().on_frame(peer, std::move(payload));
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

}  // namespace

wire::Payload encode_frame(const v1::CollectiveHeader& header, const void* body, size_t size) {
  const size_t header_size = header.ByteSizeLong();
  std::string bytes(5 + header_size + size, '\0');
  size_t at = put_varint32(static_cast<uint32_t>(header_size), bytes.data());
  header.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(bytes.data() + at));
  at += header_size;
  if (size > 0) std::memcpy(bytes.data() + at, body, size);
  bytes.resize(at + size);
  return wire::Payload::adopt(std::move(bytes));
}

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
  absl::MutexLock lock(&mu_);
  return entry(comm, rank).mailbox;
}

std::shared_ptr<detail::CommGroup> Exchange::group(const std::string& comm, int rank, bool pin,
                                                   const std::function<std::shared_ptr<detail::CommGroup>()>& make) {
  {
    absl::MutexLock lock(&mu_);
    if (auto live = entry(comm, rank).group.lock()) return live;
  }
  std::shared_ptr<detail::CommGroup> made = make();  // may call watch()/mailbox(): no lock held
  absl::MutexLock lock(&mu_);
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
    absl::MutexLock lock(&mu_);
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
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(std::make_pair(comm, rank));
  if (it != entries_.end() && it->second.group.expired()) entries_.erase(it);
}

void Exchange::on_frame(const ProcId& peer, wire::Payload payload) {
  const char* p = payload.data();
  const char* end = p + payload.size();
  uint32_t header_size = 0;
  const size_t n = get_varint32(p, end, &header_size);
  v1::CollectiveHeader header;
  if (n == 0 || header_size > static_cast<size_t>(end - p - n) || !header.ParseFromArray(p + n, static_cast<int>(header_size))) {
    CASTMESH_LOG_WARN("castmesh-collectives: dropping a malformed frame from {}", peer);
    return;
  }
  const char* body = p + n + header_size;
  const size_t body_size = static_cast<size_t>(end - body);
  const int dest = static_cast<int>(header.dest());
  std::shared_ptr<RankMailbox> box = mailbox(header.comm(), dest);
  if (header.channel() == v1::CollectiveHeader::CHANNEL_ABORT) {
    box->abort_collective(header.sequence(), absl::AbortedError(header.signature()));
    return;
  }
  MessageKey key;
  key.channel = header.channel() == v1::CollectiveHeader::CHANNEL_COLLECTIVE ? Channel::kCollective : Channel::kP2P;
  key.source = static_cast<int>(header.source());
  key.tag = header.tag();
  key.signature = header.signature();
  box->deliver(std::move(key), body, body_size, std::move(payload));
}

void Exchange::on_peer_lost(const ProcId& peer, const absl::Status& why) {
  std::vector<std::tuple<std::shared_ptr<RankMailbox>, int, absl::Status>> failed;
  {
    absl::MutexLock lock(&mu_);
    lost_.emplace(peer, why);
    for (auto& [key, e] : entries_) {
      for (size_t r = 0; r < e.procs.size(); ++r) {
        if (e.procs[r] != peer) continue;
        failed.emplace_back(e.mailbox, static_cast<int>(r),
                            absl::UnavailableError(absl::StrCat("rank ", r, " of the ", e.description, " (proc ", peer,
                                                                ") is gone: ", why.message())));
      }
    }
  }
  for (auto& [box, r, st] : failed) box->fail_source(r, st);
}

}  // namespace castmesh::collectives
