#include "core/rdma/segment_path.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "castmesh/config.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/wire/v1/rdma.pb.h"
#include "core/log/log.h"
#include "core/proc/proc_host.h"
#include "core/rdma/device_staging.h"
#include "core/rdma/registry.h"
#include "core/rdma/service.h"
#include "core/rdma/shared_segment.h"
#include "core/progress/progress_engine.h"

namespace castmesh::rdma {

// The requester's window for one operation at a time (its transfer's link_state).
struct SegmentWindow : link::TransferState {
  ProcId peer;
  std::shared_ptr<SegmentMapping> mapping;
  detail::Mutex mu;
  detail::CondVar freed;
  std::vector<uint32_t> free_slots ABSL_GUARDED_BY(mu);
  bool answered ABSL_GUARDED_BY(mu) = false;  // the owner mapped it (it answered once)
  bool refused ABSL_GUARDED_BY(mu) = false;   // the owner cannot map it
};

namespace {

namespace v1 = wire::v1;

constexpr uint32_t kSlots = 4;
// Idle windows kept per owner proc for later operations (more are made
// while more operations run at once, and closed after).
constexpr size_t kIdleWindowsPerPeer = 2;
// Windows an owner maps for one peer at most (a peer's numbers are not trusted).
constexpr size_t kMappedWindowsPerPeer = 64;
// Operations this small with few enough chunks copy on the I/O thread.
constexpr size_t kInlineBytes = 256 * 1024;

absl::Status send(proc::ProcHost& host, const ProcId& peer, const v1::RdmaHeader& header) {
  return host.send_data(peer, kRdmaDataType, header.SerializeAsString(), {});
}

// The window of `transfer` (set by begin_segment before its first message).
SegmentWindow* window_of(const Transfer& transfer) { return static_cast<SegmentWindow*>(transfer.link_state.get()); }

bool is_finished(const std::shared_ptr<Transfer>& transfer) {
  detail::MutexLock lock(transfer->mu);
  return transfer->finished;
}

bool switched_off() {
  return !config::global().rdma_shared_segment;
}

// ---- requester side ----

// Idle windows per owner proc, and the owners that cannot map one.
class Windows {
 public:
  static Windows& instance() {
    static auto* windows = new Windows;
    return *windows;
  }

  // A window with every slot free: an idle one of this geometry, or a new one.
  absl::StatusOr<std::shared_ptr<SegmentWindow>> take(const ProcId& peer, uint64_t slot_bytes) {
    std::shared_ptr<SegmentWindow> window;
    {
      detail::MutexLock lock(mu_);
      auto it = idle_.find(peer);
      if (it != idle_.end()) {
        auto& list = it->second;
        auto found = std::find_if(list.begin(), list.end(),
                                  [&](const auto& w) { return w->mapping->slot_bytes() == slot_bytes; });
        if (found != list.end()) {
          window = std::move(*found);
          list.erase(found);
        }
      }
    }
    if (window == nullptr) {
      absl::StatusOr<std::shared_ptr<SegmentMapping>> mapping = SegmentMapping::create(slot_bytes, kSlots);
      if (!mapping.ok()) return mapping.status();
      window = std::make_shared<SegmentWindow>();
      window->peer = peer;
      window->mapping = *std::move(mapping);
    }
    detail::MutexLock lock(window->mu);
    window->free_slots.clear();
    for (uint32_t i = kSlots; i > 0; --i) window->free_slots.push_back(i - 1);
    return window;
  }

  // The operation on `window` is over: keep it for the next one when it
  // succeeded (the owner is done with it), else close it at the owner.
  void done_with(const std::weak_ptr<proc::ProcHost>& weak, std::shared_ptr<SegmentWindow> window, uint64_t op,
                 bool ok) {
    window->mapping->unlink();
    bool reusable = ok;  // success needed the owner's answer: it has the window mapped, and is done with it
    {
      detail::MutexLock lock(window->mu);
      reusable = reusable && !window->refused;
    }
    if (reusable) {
      detail::MutexLock lock(mu_);
      auto& list = idle_[window->peer];
      if (list.size() < kIdleWindowsPerPeer) {
        list.push_back(std::move(window));
        return;
      }
    }
    if (std::shared_ptr<proc::ProcHost> host = weak.lock()) {
      v1::RdmaHeader close = header_of(v1::RdmaHeader::SEGMENT_CLOSE, ok ? 0 : op);
      close.set_segment(window->mapping->name());
      (void)send(*host, window->peer, close);
    }
  }

  // `peer` cannot map our windows: later operations to it skip the transport.
  void refuse(const ProcId& peer, std::string_view why) {
    detail::MutexLock lock(mu_);
    if (refused_.try_emplace(peer, std::string(why)).second) {
      CASTMESH_LOG_INFO("castmesh-rdma: proc {} cannot map a shared segment of this process ({}); its RDMA "
                        "buffers go through the socket transport from now on",
                        peer, std::string(why));
    }
  }
  bool refused(const ProcId& peer) {
    detail::MutexLock lock(mu_);
    return refused_.contains(peer);
  }
  void peer_lost(const ProcId& peer) {
    std::vector<std::shared_ptr<SegmentWindow>> dropped;  // unmapped after the lock
    detail::MutexLock lock(mu_);
    if (auto it = idle_.find(peer); it != idle_.end()) {
      dropped = std::move(it->second);
      idle_.erase(it);
    }
  }

 private:
  detail::Mutex mu_;
  absl::flat_hash_map<ProcId, std::vector<std::shared_ptr<SegmentWindow>>> idle_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ProcId, std::string> refused_ ABSL_GUARDED_BY(mu_);
};

// The owner cannot map a window (or none could be made): the transfer's
// next route (the socket).
void fall_back_to_socket(const std::shared_ptr<Transfer>& transfer) { link::start_next(transfer); }

// A free slot of `window` for chunk `index`: the first chunk of an operation
// on a window the owner has not answered for goes alone (the owner may
// refuse the window). nullopt once the transfer finished or the window was refused.
std::optional<uint32_t> take_slot(SegmentWindow& window, const std::shared_ptr<Transfer>& transfer, uint64_t index) {
  while (true) {
    {
      detail::MutexLock lock(window.mu);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(window.mu) {
        return window.refused || (!window.free_slots.empty() && (index == 0 || window.answered));
      };
      // Wakes now and then to notice a transfer that timed out or lost its owner.
      window.freed.wait_for(lock, absl::Milliseconds(20), ready);
      if (window.refused) return std::nullopt;
      if (ready()) {
        const uint32_t slot = window.free_slots.back();
        window.free_slots.pop_back();
        return slot;
      }
    }
    if (is_finished(transfer)) return std::nullopt;
  }
}

// Copies the source into slots and sends each as SEGMENT_WRITE_DATA.
void send_write_slots(const std::shared_ptr<Transfer>& transfer) {
  SegmentWindow& window = *window_of(*transfer);
  const SegmentMapping& mapping = *window.mapping;
  uint64_t at = 0;
  uint64_t index = 0;
  do {
    const std::optional<uint32_t> slot = take_slot(window, transfer, index++);
    if (!slot) return;
    const uint64_t n = std::min<uint64_t>(mapping.slot_bytes(), transfer->length - at);
    absl::Status copied;
    // Under the transfer's lock: a caller told of a timeout may free the source.
    const bool live = Transfers::instance().copy_if_live(
        transfer,
        [&] {
          if (n > 0) std::memcpy(mapping.slot(*slot), transfer->bytes + at, n);
          return absl::OkStatus();
        },
        &copied);
    if (!live) return;
    std::shared_ptr<proc::ProcHost> host = transfer->host.lock();
    if (host == nullptr) {
      return Transfers::instance().finish(transfer, absl::UnavailableError("this proc's transport is shut down"));
    }
    v1::RdmaHeader data = header_of(v1::RdmaHeader::SEGMENT_WRITE_DATA, transfer->id);
    data.set_buffer(transfer->remote.id);
    data.set_offset(transfer->offset + at);
    data.set_op_offset(transfer->offset);
    data.set_length(transfer->length);
    data.set_chunk_length(n);
    data.set_slot(*slot);
    data.set_segment(mapping.name());
    data.set_chunk(mapping.slot_bytes());
    data.set_slots(mapping.slots());
    if (absl::Status sent = send(*host, transfer->remote.owner, data); !sent.ok()) {
      return Transfers::instance().finish(transfer, sent);
    }
    at += n;
  } while (at < transfer->length);
}

// The segment transfer `op` from `peer`, or nullptr (finished, or not one).
std::shared_ptr<Transfer> segment_transfer(const ProcId& peer, uint64_t op) {
  std::shared_ptr<Transfer> transfer = Transfers::instance().find(op);
  if (transfer == nullptr || transfer->remote.owner != peer || transfer->transport != RdmaTransport::kSharedSegment) {
    return nullptr;
  }
  detail::MutexLock lock(transfer->mu);  // orders this thread after begin_segment's write of link_state
  return transfer->link_state == nullptr ? nullptr : transfer;
}

void mark_answered(SegmentWindow& window) {
  window.mapping->unlink();  // the owner has mapped it: the name is no longer needed
  detail::MutexLock lock(window.mu);
  window.answered = true;
}

// SEGMENT_DATA: copies a slot into the read's destination and hands it back.
void on_data(proc::ProcHost& host, const ProcId& peer, const v1::RdmaHeader& header) {
  std::shared_ptr<Transfer> transfer = segment_transfer(peer, header.op());
  if (transfer == nullptr || transfer->write) return;  // late: the window was closed
  std::shared_ptr<SegmentWindow> window = std::static_pointer_cast<SegmentWindow>(transfer->link_state);  // kept mapped while copying
  mark_answered(*window);
  const SegmentMapping& mapping = *window->mapping;
  if (header.slot() >= mapping.slots() || header.chunk_length() > mapping.slot_bytes()) {
    return Transfers::instance().finish(
        transfer, absl::InternalError(absl::StrCat("proc ", peer, " named slot ", header.slot(), " with ",
                                                   header.chunk_length(), " bytes, outside the shared segment")));
  }
  Transfers::instance().deliver(transfer, header.offset(), mapping.slot(header.slot()), header.chunk_length());
  if (is_finished(transfer)) return;
  v1::RdmaHeader free = header_of(v1::RdmaHeader::SEGMENT_FREE, header.op());
  free.set_slot(header.slot());
  if (absl::Status sent = send(host, peer, free); !sent.ok()) Transfers::instance().finish(transfer, sent);
}

// SEGMENT_FREE for a write: the owner emptied a slot.
void on_write_slot_free(const ProcId& peer, const v1::RdmaHeader& header) {
  std::shared_ptr<Transfer> transfer = segment_transfer(peer, header.op());
  if (transfer == nullptr || !transfer->write) return;
  SegmentWindow& window = *window_of(*transfer);
  mark_answered(window);
  detail::MutexLock lock(window.mu);
  if (header.slot() < window.mapping->slots() &&
      std::find(window.free_slots.begin(), window.free_slots.end(), header.slot()) == window.free_slots.end()) {
    window.free_slots.push_back(header.slot());
  }
  window.freed.notify_all();
}

void on_refused(const ProcId& peer, const v1::RdmaHeader& header) {
  std::shared_ptr<Transfer> transfer = segment_transfer(peer, header.op());
  if (transfer == nullptr) return;
  Windows::instance().refuse(peer, header.error_message());
  {
    detail::MutexLock lock(window_of(*transfer)->mu);
    window_of(*transfer)->refused = true;
    window_of(*transfer)->freed.notify_all();
  }
  fall_back_to_socket(transfer);
}

// ---- owner side ----

// A read the owner copies into a peer's window, slot by slot.
struct OwnerRead {
  uint32_t slots = 0;  // in its window
  detail::Mutex mu;
  detail::CondVar freed;
  std::vector<uint32_t> free_slots ABSL_GUARDED_BY(mu);
  bool cancelled ABSL_GUARDED_BY(mu) = false;
};

// The owner's mapped windows and running reads, per peer.
class OwnerSide {
 public:
  static OwnerSide& instance() {
    static auto* owner = new OwnerSide;
    return *owner;
  }

  // The window `header` names, mapped on first use.
  absl::StatusOr<std::shared_ptr<SegmentMapping>> mapping(const ProcId& peer, const v1::RdmaHeader& header) {
    {
      detail::MutexLock lock(mu_);
      auto& windows = mapped_[peer];
      if (auto it = windows.find(header.segment()); it != windows.end()) {
        if (it->second->slot_bytes() != header.chunk() || it->second->slots() != header.slots()) {
          return absl::InvalidArgumentError("the shared segment's geometry changed");
        }
        return it->second;
      }
      if (windows.size() >= kMappedWindowsPerPeer) {
        return absl::ResourceExhaustedError(
            absl::StrCat("proc ", peer, " has ", windows.size(), " shared segments mapped here already"));
      }
    }
    absl::StatusOr<std::shared_ptr<SegmentMapping>> attached =
        SegmentMapping::attach(header.segment(), header.chunk(), header.slots());
    if (!attached.ok()) return attached.status();
    detail::MutexLock lock(mu_);
    mapped_[peer][header.segment()] = *attached;
    return attached;
  }

  std::shared_ptr<OwnerRead> start_read(const ProcId& peer, uint64_t op, uint32_t slots) {
    auto read = std::make_shared<OwnerRead>();
    read->slots = slots;
    {
      detail::MutexLock lock(read->mu);
      for (uint32_t i = slots; i > 0; --i) read->free_slots.push_back(i - 1);
    }
    detail::MutexLock lock(mu_);
    reads_[std::make_pair(peer, op)] = read;
    return read;
  }
  void end_read(const ProcId& peer, uint64_t op) {
    detail::MutexLock lock(mu_);
    reads_.erase(std::make_pair(peer, op));
  }
  std::shared_ptr<OwnerRead> read(const ProcId& peer, uint64_t op) {
    detail::MutexLock lock(mu_);
    auto it = reads_.find(std::make_pair(peer, op));
    return it == reads_.end() ? nullptr : it->second;
  }

  // SEGMENT_CLOSE: unmaps the window (once its copies finish) and cancels `op`.
  void close(const ProcId& peer, const std::string& name, uint64_t op) {
    std::shared_ptr<SegmentMapping> unmapped;
    if (op != 0) cancel(read(peer, op));
    detail::MutexLock lock(mu_);
    auto it = mapped_.find(peer);
    if (it == mapped_.end()) return;
    if (auto found = it->second.find(name); found != it->second.end()) {
      unmapped = std::move(found->second);
      it->second.erase(found);
    }
  }

  void peer_lost(const ProcId& peer) {
    std::vector<std::shared_ptr<OwnerRead>> cancelled;
    absl::flat_hash_map<std::string, std::shared_ptr<SegmentMapping>> unmapped;
    {
      detail::MutexLock lock(mu_);
      for (const auto& [key, read] : reads_) {
        if (key.first == peer) cancelled.push_back(read);
      }
      if (auto it = mapped_.find(peer); it != mapped_.end()) {
        unmapped = std::move(it->second);
        mapped_.erase(it);
      }
    }
    for (const auto& read : cancelled) cancel(read);
  }

  static void cancel(const std::shared_ptr<OwnerRead>& read) {
    if (read == nullptr) return;
    detail::MutexLock lock(read->mu);
    read->cancelled = true;
    read->freed.notify_all();
  }

 private:
  detail::Mutex mu_;
  absl::flat_hash_map<ProcId, absl::flat_hash_map<std::string, std::shared_ptr<SegmentMapping>>> mapped_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::pair<ProcId, uint64_t>, std::shared_ptr<OwnerRead>> reads_ ABSL_GUARDED_BY(mu_);
};

// A window this process cannot map: SEGMENT_REFUSED (the requester goes by
// socket from now on), or FAILED when only resources ran short for now.
void refuse(proc::ProcHost& host, const ProcId& peer, uint64_t op, const absl::Status& why) {
  send_failure(host, peer, op, why,
               absl::IsResourceExhausted(why) ? v1::RdmaHeader::FAILED : v1::RdmaHeader::SEGMENT_REFUSED);
}

// Copies [offset, offset+length) of `registration` into the window slot by
// slot, waiting for the requester to empty a slot before filling it again.
void copy_read_slots(const std::weak_ptr<proc::ProcHost>& weak, const ProcId& peer, uint64_t op,
                     const std::shared_ptr<const Registration>& registration,
                     const std::shared_ptr<SegmentMapping>& mapping, const std::shared_ptr<OwnerRead>& read,
                     uint64_t offset, uint64_t length) {
  uint64_t at = offset;
  do {
    uint32_t slot = 0;
    {
      detail::MutexLock lock(read->mu);
      read->freed.wait(lock, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(read->mu) {
        return read->cancelled || !read->free_slots.empty();
      });
      if (read->cancelled) break;
      slot = read->free_slots.back();
      read->free_slots.pop_back();
    }
    const uint64_t n = std::min(mapping->slot_bytes(), offset + length - at);
    absl::Status copied = copy_out(*registration, at, mapping->slot(slot), n);  // staged for device memory
    std::shared_ptr<proc::ProcHost> host = weak.lock();  // per chunk: a long copy must not keep a closing host
    if (host == nullptr) break;
    if (!copied.ok()) {
      send_failure(*host, peer, op, copied, v1::RdmaHeader::FAILED);
      break;
    }
    v1::RdmaHeader data = header_of(v1::RdmaHeader::SEGMENT_DATA, op);
    data.set_offset(at);
    data.set_chunk_length(n);
    data.set_slot(slot);
    if (!send(*host, peer, data).ok()) break;
    at += n;
  } while (at < offset + length);
  OwnerSide::instance().end_read(peer, op);
}

void on_read(const std::weak_ptr<proc::ProcHost>& weak, proc::ProcHost& host, const ProcId& peer,
             const v1::RdmaHeader& header) {
  auto opened = Registry::instance().open(header.buffer(), /*write=*/false, header.offset(), header.length());
  if (!opened.ok()) return send_failure(host, peer, header.op(), opened.status());
  absl::StatusOr<std::shared_ptr<SegmentMapping>> mapping = OwnerSide::instance().mapping(peer, header);
  if (!mapping.ok()) return refuse(host, peer, header.op(), mapping.status());
  std::shared_ptr<OwnerRead> read = OwnerSide::instance().start_read(peer, header.op(), header.slots());
  auto job = [weak, peer, op = header.op(), registration = *std::move(opened), mapping = *std::move(mapping), read,
              offset = header.offset(), length = header.length()] {
    copy_read_slots(weak, peer, op, registration, mapping, read, offset, length);
  };
  // Few enough chunks never wait for a slot: copy them here.
  if (header.length() < kInlineBytes && header.length() <= header.chunk() * header.slots()) return job();
  progress::ProgressEngine::instance().submit(progress::Job{std::move(job), {}});
}

void on_write_data(proc::ProcHost& host, const ProcId& peer, const v1::RdmaHeader& header, const ApplyWrite& apply) {
  absl::StatusOr<std::shared_ptr<SegmentMapping>> mapping = OwnerSide::instance().mapping(peer, header);
  if (!mapping.ok()) return refuse(host, peer, header.op(), mapping.status());
  if (header.slot() >= (*mapping)->slots() || header.chunk_length() > (*mapping)->slot_bytes()) {
    return send_failure(host, peer, header.op(),
                        absl::InvalidArgumentError(absl::StrCat("slot ", header.slot(), " with ",
                                                                header.chunk_length(),
                                                                " bytes lies outside the shared segment")));
  }
  std::optional<v1::RdmaHeader> answer = apply((*mapping)->slot(header.slot()), header.chunk_length());
  if (answer) {
    (void)send(host, peer, *answer);
    return;
  }
  v1::RdmaHeader free = header_of(v1::RdmaHeader::SEGMENT_FREE, header.op());
  free.set_slot(header.slot());
  free.set_write(true);
  (void)send(host, peer, free);
}

}  // namespace

bool shared_segment_reaches(const ProcId& owner) { return !switched_off() && !Windows::instance().refused(owner); }

namespace {

void begin_segment(const std::shared_ptr<Transfer>& transfer) {
  const uint64_t slot_bytes = std::min<uint64_t>(chunk_bytes(), kMaxSlotBytes);
  absl::StatusOr<std::shared_ptr<SegmentWindow>> window = Windows::instance().take(transfer->remote.owner, slot_bytes);
  if (!window.ok()) {
    CASTMESH_LOG_WARN_LIMITED("castmesh-rdma: no shared segment for an RDMA operation ({}); it goes through the "
                              "socket transport",
                              std::string(window.status().message()));
    return fall_back_to_socket(transfer);
  }
  {
    detail::MutexLock lock(transfer->mu);
    if (!transfer->finished) {
      transfer->link_state = *window;
      transfer->cleanup = [weak = transfer->host, window = *window, op = transfer->id](bool ok) {
        Windows::instance().done_with(weak, window, op, ok);
      };
    }
  }
  if (transfer->link_state == nullptr) return Windows::instance().done_with(transfer->host, *window, 0, true);
  if (transfer->write) {
    if (transfer->length <= kInlineBytes) return send_write_slots(transfer);
    progress::ProgressEngine::instance().submit(progress::Job{[transfer] { send_write_slots(transfer); }, {}});
    return;
  }
  std::shared_ptr<proc::ProcHost> host = transfer->host.lock();
  if (host == nullptr) {
    return Transfers::instance().finish(transfer, absl::UnavailableError("this proc's transport is shut down"));
  }
  const SegmentMapping& mapping = *window_of(*transfer)->mapping;
  v1::RdmaHeader read = header_of(v1::RdmaHeader::SEGMENT_READ, transfer->id);
  read.set_buffer(transfer->remote.id);
  read.set_offset(transfer->offset);
  read.set_length(transfer->length);
  read.set_segment(mapping.name());
  read.set_chunk(mapping.slot_bytes());
  read.set_slots(mapping.slots());
  if (absl::Status sent = send(*host, transfer->remote.owner, read); !sent.ok()) Transfers::instance().finish(transfer, sent);
}

class SharedSegmentLink final : public link::Link {
 public:
  link::Path path(const ProcId&) const override { return link::Path::kSharedSegment; }
  link::Capabilities capabilities() const override { return link::Capabilities{}; }
  void start(const std::shared_ptr<link::Transfer>& transfer) override {
    // The owner may have refused a window since the route was chosen.
    if (transfer->release || !shared_segment_reaches(transfer->remote.owner)) return link::start_next(transfer);
    if (transfer->host.expired()) {
      return Transfers::instance().finish(transfer, absl::UnavailableError("this proc's transport is shut down"));
    }
    transfer->transport = RdmaTransport::kSharedSegment;  // nothing else reads it before the first message goes
    begin_segment(transfer);
  }
};

}  // namespace

link::Link& shared_segment_link() {
  static auto* segment = new SharedSegmentLink;
  return *segment;
}

void on_segment_message(const std::weak_ptr<proc::ProcHost>& weak, proc::ProcHost& host, const ProcId& peer,
                        const v1::RdmaHeader& header, const ApplyWrite& apply) {
  switch (header.kind()) {
    case v1::RdmaHeader::SEGMENT_READ:
      return on_read(weak, host, peer, header);
    case v1::RdmaHeader::SEGMENT_WRITE_DATA:
      return on_write_data(host, peer, header, apply);
    case v1::RdmaHeader::SEGMENT_DATA:
      return on_data(host, peer, header);
    case v1::RdmaHeader::SEGMENT_FREE:
      // Both directions use it (`write` tells which; op numbers of the two
      // processes overlap): a write's slot back at the requester, a read's at the owner.
      if (header.write()) return on_write_slot_free(peer, header);
      if (std::shared_ptr<OwnerRead> read = OwnerSide::instance().read(peer, header.op())) {
        detail::MutexLock lock(read->mu);
        if (header.slot() < read->slots &&  // a peer's number: never a slot outside the window
            std::find(read->free_slots.begin(), read->free_slots.end(), header.slot()) == read->free_slots.end()) {
          read->free_slots.push_back(header.slot());
        }
        read->freed.notify_all();
      }
      return;
    case v1::RdmaHeader::SEGMENT_CLOSE:
      return OwnerSide::instance().close(peer, header.segment(), header.op());
    case v1::RdmaHeader::SEGMENT_REFUSED:
      return on_refused(peer, header);
    default:
      return;
  }
}

void segment_peer_lost(const ProcId& peer) {
  Windows::instance().peer_lost(peer);
  OwnerSide::instance().peer_lost(peer);
}

}  // namespace castmesh::rdma
