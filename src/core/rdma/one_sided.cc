#include "core/rdma/one_sided.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "castmesh/config.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/wire/v1/rdma.pb.h"
#include "core/link/single_copy.h"
#include "core/log/log.h"
#include "core/platform/platform.h"
#include "core/proc/proc_host.h"
#include "core/rdma/segment_path.h"
#include "core/rdma/service.h"
#include "core/rdma/shared_segment.h"
#include "core/progress/progress_engine.h"

namespace castmesh::rdma {
namespace {

namespace v1 = wire::v1;

// The table's layout in shared memory. Both sides are the same build; the
// requester still checks the header and every entry it uses.
constexpr uint64_t kTableMagic = 0x31544d5344455243;  // "CREDSMT1"
constexpr uint32_t kTableVersion = 1;
constexpr uint64_t kTableBytes = 64 * 1024;

struct TableHeader {
  std::atomic<uint64_t> magic;
  std::atomic<uint64_t> version;
  std::atomic<uint64_t> slots;
  std::atomic<uint64_t> pid;
  char pad[32];
};

// One registered buffer. `word`: generation << 16 | releasing << 15 | in flight.
struct TableEntry {
  std::atomic<uint64_t> word;
  std::atomic<uint64_t> address;
  std::atomic<uint64_t> size;
  std::atomic<uint64_t> access;
  char pad[32];
};

static_assert(sizeof(TableHeader) == 64 && sizeof(TableEntry) == 64);
static_assert(sizeof(TableHeader) + kOneSidedSlots * sizeof(TableEntry) <= kTableBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free, "table words are shared between processes");

constexpr uint64_t kInFlightMask = 0x7fff;
constexpr uint64_t kReleasing = uint64_t{1} << 15;
constexpr int kGenerationShift = 16;
constexpr uint64_t kMaxGeneration = (uint64_t{1} << 48) - 1;

TableHeader* header_of(const SegmentMapping& map) { return reinterpret_cast<TableHeader*>(map.slot(0)); }
TableEntry* entry_of(const SegmentMapping& map, uint32_t slot) {
  return reinterpret_cast<TableEntry*>(map.slot(0) + sizeof(TableHeader)) + slot;
}

absl::Status send(proc::ProcHost& host, const ProcId& peer, const v1::RdmaHeader& header) {
  return host.send_data(peer, kRdmaDataType, header.SerializeAsString(), {});
}

// ---- owner side ----

class Owner {
 public:
  static Owner& instance() {
    static auto* owner = new Owner;  // leaked: I/O threads may use it during exit
    return *owner;
  }

  OneSidedRef publish(const Registration& registration) {
    detail::MutexLock lock(mu_);
    if (free_.empty()) return {};
    const uint32_t slot = free_.back();
    free_.pop_back();
    Slot& s = slots_[slot];
    if (s.generation == kMaxGeneration) return {};  // never reused again (after 2^48 registrations)
    s.generation += 1;
    s.live = true;
    s.address = reinterpret_cast<uint64_t>(registration.base);
    s.size = registration.size;
    s.access = static_cast<uint64_t>(registration.access);
    by_registration_[registration.id] = slot;
    for (const Table& table : tables_) write_entry(*table.map, slot);
    return OneSidedRef{slot, s.generation};
  }

  void retire(std::shared_ptr<const Registration> registration) {
    if (registration == nullptr) return;
    {
      detail::MutexLock lock(mu_);
      auto it = by_registration_.find(registration->id);
      if (it == by_registration_.end()) return;
      const uint32_t slot = it->second;
      by_registration_.erase(it);
      slots_[slot].live = false;
      for (const Table& table : tables_) entry_of(*table.map, slot)->word.fetch_or(kReleasing);
      if (drained(slot)) {
        free_.push_back(slot);
      } else {
        draining_.push_back(Drain{slot, std::move(registration)});
        if (!drainer_running_) {
          drainer_running_ = true;
          progress::ProgressEngine::instance().submit(progress::Job{[this] { drain(); }, {}});
        }
      }
    }
    // A drained registration is dropped here, outside the lock.
  }

  void on_table_open(proc::ProcHost& host, const ProcId& peer, const v1::RdmaHeader& request) {
    v1::RdmaHeader answer;
    answer.set_kind(v1::RdmaHeader::TABLE);
    answer.set_op(request.op());
    absl::StatusOr<std::shared_ptr<SegmentMapping>> made = SegmentMapping::create(kTableBytes, 1);
    if (made.ok()) {
      TableHeader* header = header_of(**made);
      header->slots.store(kOneSidedSlots, std::memory_order_relaxed);
      header->pid.store(static_cast<uint64_t>(::getpid()), std::memory_order_relaxed);
      header->version.store(kTableVersion, std::memory_order_relaxed);
      header->magic.store(kTableMagic, std::memory_order_release);
      detail::MutexLock lock(mu_);
      for (uint32_t slot = 0; slot < kOneSidedSlots; ++slot) write_entry(**made, slot);
      tables_.push_back(Table{peer, *made});
      answer.set_segment((*made)->name());
      answer.set_pid(::getpid());
      answer.set_slots(kOneSidedSlots);
    } else {
      answer.set_error_code(static_cast<int32_t>(made.status().code()));
      answer.set_error_message(std::string(made.status().message()));
    }
    if (!send(host, peer, answer).ok() && made.ok()) (*made)->unlink();  // the peer is gone: its table goes with it
  }

  void peer_lost(const ProcId& peer) {
    std::vector<std::shared_ptr<SegmentMapping>> dropped;  // unmapped after the lock
    detail::MutexLock lock(mu_);
    for (auto it = tables_.begin(); it != tables_.end();) {
      if (it->peer == peer) {
        it->map->unlink();  // in case the peer died before opening it
        dropped.push_back(std::move(it->map));
        it = tables_.erase(it);
      } else {
        ++it;
      }
    }
  }

 private:
  struct Slot {
    uint64_t generation = 0;
    bool live = false;
    uint64_t address = 0;
    uint64_t size = 0;
    uint64_t access = 0;
  };
  struct Table {
    ProcId peer;
    std::shared_ptr<SegmentMapping> map;
  };
  struct Drain {
    uint32_t slot;
    std::shared_ptr<const Registration> registration;
  };

  Owner() : slots_(kOneSidedSlots) {
    for (uint32_t slot = kOneSidedSlots; slot > 0; --slot) free_.push_back(slot - 1);
  }

  // Publishes slot `slot` into `map`: the facts first, then the word that
  // makes them valid (release order). Only a slot nobody is inside is
  // written: a free slot's count drained before it was freed.
  void write_entry(const SegmentMapping& map, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Slot& s = slots_[slot];
    TableEntry* entry = entry_of(map, slot);
    entry->address.store(s.address, std::memory_order_relaxed);
    entry->size.store(s.size, std::memory_order_relaxed);
    entry->access.store(s.access, std::memory_order_relaxed);
    entry->word.store((s.generation << kGenerationShift) | (s.live ? 0 : kReleasing), std::memory_order_release);
  }

  // Whether no table of a live requester counts a copy of `slot` in flight.
  bool drained(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Table& table : tables_) {
      if ((entry_of(*table.map, slot)->word.load(std::memory_order_acquire) & kInFlightMask) != 0) return false;
    }
    return true;
  }

  // Waits (polling: copies last microseconds to milliseconds) until every
  // draining slot is free, dropping each registration when its slot is.
  void drain() {
    auto pause = std::chrono::microseconds(20);
    for (;;) {
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
      std::vector<std::shared_ptr<const Registration>> done;  // dropped after the lock
      detail::MutexLock lock(mu_);
      for (auto it = draining_.begin(); it != draining_.end();) {
        if (drained(it->slot)) {
          free_.push_back(it->slot);
          done.push_back(std::move(it->registration));
          it = draining_.erase(it);
        } else {
          ++it;
        }
      }
      if (draining_.empty()) {
        drainer_running_ = false;
        return;
      }
    }
  }

  detail::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint32_t> by_registration_ ABSL_GUARDED_BY(mu_);
  std::vector<Table> tables_ ABSL_GUARDED_BY(mu_);
  std::vector<Drain> draining_ ABSL_GUARDED_BY(mu_);
  bool drainer_running_ ABSL_GUARDED_BY(mu_) = false;
};

// ---- requester side ----

// The result of one attempt: a result, or "take another transport".
struct Attempt {
  bool fall_back = false;
  absl::Status status;
};

absl::Status released_error(uint64_t buffer, const ProcId& owner) {
  return absl::FailedPreconditionError(absl::StrCat("RDMA buffer ", buffer, " of proc ", owner,
                                                    " was released (or never registered in its process)"));
}

// Enters `ref`'s entry of `map`, checks it, copies and leaves.
Attempt copy_one_sided(const SegmentMapping& map, uint32_t slots, const ProcId& owner, int64_t pid, uint64_t buffer,
                       OneSidedRef ref, char* local, bool write, uint64_t offset, size_t length) {
  if (ref.slot >= slots || ref.generation == 0 || ref.generation > kMaxGeneration) {
    return {false, absl::InvalidArgumentError(absl::StrCat("the RdmaBuffer handle of buffer ", buffer, " of proc ",
                                                           owner, " names one-sided slot ", ref.slot, " generation ",
                                                           ref.generation, "; the owner's table has ", slots,
                                                           " slots (a corrupt handle)"))};
  }
  TableEntry* entry = entry_of(map, ref.slot);
  uint64_t word = entry->word.load(std::memory_order_acquire);
  for (;;) {
    if ((word >> kGenerationShift) != ref.generation || (word & kReleasing) != 0) {
      return {false, released_error(buffer, owner)};
    }
    if ((word & kInFlightMask) == kInFlightMask) return {true, absl::OkStatus()};  // full: ask the owner instead
    if (entry->word.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel, std::memory_order_acquire)) break;
  }
  // Inside: the owner changes none of these until the count is back to 0.
  const uint64_t address = entry->address.load(std::memory_order_relaxed);
  const uint64_t size = entry->size.load(std::memory_order_relaxed);
  const uint64_t access = entry->access.load(std::memory_order_relaxed);
  const std::string what = absl::StrCat("RDMA buffer ", buffer, " of proc ", owner);
  absl::Status checked;
  if (address == 0 || access == 0 || access > 3 || size > (uint64_t{1} << 56) || address + size < address) {
    checked = absl::InternalError(absl::StrCat("the one-sided table entry of ", what, " is corrupt (address ", address,
                                               ", size ", size, ", access ", access, ")"));
  } else {
    checked = check_operation(what, size, static_cast<RdmaAccess>(access), write, offset, length);
  }
  absl::Status copied = checked;
  if (checked.ok() && length > 0) copied = link::copy_between(pid, address + offset, local, length, write);
  entry->word.fetch_sub(1, std::memory_order_release);
  if (checked.ok() && (absl::IsPermissionDenied(copied) || absl::IsUnimplemented(copied))) {
    link::note_single_copy_refused(copied);  // the kernel refuses: later operations skip single copy
    return {true, absl::OkStatus()};
  }
  return {false, copied};
}

class Requester {
 public:
  static Requester& instance() {
    static auto* requester = new Requester;  // leaked, as Owner
    return *requester;
  }

  // The owner's table when mapped here (with its slot count), else nullptr.
  std::shared_ptr<const SegmentMapping> ready(const ProcId& owner, int64_t pid, uint32_t* slots) {
    detail::MutexLock lock(mu_);
    auto it = remotes_.find(owner);
    if (it == remotes_.end() || it->second.phase != Phase::kReady || it->second.pid != pid) return nullptr;
    *slots = it->second.slots;
    return it->second.map;
  }

  void begin(const std::shared_ptr<Transfer>& transfer) {
    bool ask = false;
    bool queued = false;
    std::shared_ptr<const SegmentMapping> map;
    uint32_t slots = 0;
    {
      detail::MutexLock lock(mu_);
      auto [it, fresh] = remotes_.try_emplace(transfer->remote.owner);
      Remote& remote = it->second;
      if (fresh) {
        remote.phase = Phase::kOpening;
        ask = true;
      }
      if (remote.phase == Phase::kOpening) {
        remote.waiting.push_back(transfer);  // on_table (or a failed send) takes it from here
        queued = true;
      } else if (remote.phase == Phase::kReady && remote.pid == transfer->remote.pid) {
        map = remote.map;
        slots = remote.slots;
      }
    }
    if (ask) return send_open(transfer);
    if (queued) return;
    if (map != nullptr) return run(transfer, std::move(map), slots);
    fall_back(transfer);
  }

  void on_table(proc::ProcHost& host, const ProcId& owner, const v1::RdmaHeader& header) {
    absl::StatusOr<std::shared_ptr<SegmentMapping>> map = absl::UnavailableError("");
    if (header.error_code() != 0) {
      map = absl::UnavailableError(absl::StrCat("proc ", owner, " could not make its table: ", header.error_message()));
    } else {
      map = attach(host, owner, header);
    }
    std::vector<std::shared_ptr<Transfer>> waiting;
    uint32_t slots = 0;
    {
      detail::MutexLock lock(mu_);
      auto it = remotes_.find(owner);
      if (it == remotes_.end() || it->second.phase != Phase::kOpening) return;  // lost meanwhile
      Remote& remote = it->second;
      waiting.swap(remote.waiting);
      if (map.ok()) {
        remote.phase = Phase::kReady;
        remote.map = *map;
        remote.pid = header.pid();
        remote.slots = header.slots();
        slots = remote.slots;
      } else {
        remote.phase = Phase::kFailed;
      }
    }
    if (!map.ok()) {
      CASTMESH_LOG_WARN_LIMITED("castmesh-rdma: no one-sided copies with proc {} ({}); its buffers are reached "
                                "through requests to it",
                                owner, std::string(map.status().message()));
    }
    for (const std::shared_ptr<Transfer>& transfer : waiting) {
      if (map.ok() && transfer->remote.pid == header.pid()) {
        run(transfer, *map, slots);
      } else {
        fall_back(transfer);
      }
    }
  }

  void peer_lost(const ProcId& owner) {
    std::shared_ptr<const SegmentMapping> dropped;  // unmapped after the lock (copies in flight hold their own)
    detail::MutexLock lock(mu_);
    auto it = remotes_.find(owner);
    if (it == remotes_.end()) return;
    dropped = std::move(it->second.map);
    remotes_.erase(it);  // its waiting transfers fail through Transfers::owner_lost
  }

 private:
  enum class Phase { kOpening, kReady, kFailed };
  struct Remote {
    Phase phase = Phase::kOpening;
    std::shared_ptr<const SegmentMapping> map;
    int64_t pid = 0;
    uint32_t slots = 0;
    std::vector<std::shared_ptr<Transfer>> waiting;
  };

  // Maps the owner's table and checks its header against the answer and the connection.
  static absl::StatusOr<std::shared_ptr<SegmentMapping>> attach(proc::ProcHost& host, const ProcId& owner,
                                                                const v1::RdmaHeader& header) {
    const std::optional<long> connected = host.peer_pid(owner);
    if (header.pid() <= 0 || (connected && *connected != header.pid())) {
      return absl::InternalError(absl::StrCat("its table names process ", header.pid(), ", not the connected one"));
    }
    if (header.slots() == 0 || header.slots() > kOneSidedSlots) {
      return absl::InternalError(absl::StrCat("its table announces ", header.slots(), " slots"));
    }
    absl::StatusOr<std::shared_ptr<SegmentMapping>> map = SegmentMapping::attach(header.segment(), kTableBytes, 1);
    if (!map.ok()) return map.status();
    const TableHeader* table = header_of(**map);
    if (table->magic.load(std::memory_order_acquire) != kTableMagic ||
        table->version.load(std::memory_order_relaxed) != kTableVersion ||
        table->slots.load(std::memory_order_relaxed) != header.slots() ||
        table->pid.load(std::memory_order_relaxed) != static_cast<uint64_t>(header.pid())) {
      return absl::InternalError("its table's header does not match the announcement");
    }
    return map;
  }

  void send_open(const std::shared_ptr<Transfer>& transfer) {
    std::shared_ptr<proc::ProcHost> host = transfer->host.lock();
    absl::Status sent = absl::UnavailableError("this proc's transport is shut down");
    if (host != nullptr) {
      v1::RdmaHeader open;
      open.set_kind(v1::RdmaHeader::TABLE_OPEN);
      open.set_op(transfer->id);
      sent = send(*host, transfer->remote.owner, open);
    }
    if (sent.ok()) return;
    std::vector<std::shared_ptr<Transfer>> waiting;
    {
      detail::MutexLock lock(mu_);
      auto it = remotes_.find(transfer->remote.owner);
      if (it != remotes_.end() && it->second.phase == Phase::kOpening) {
        waiting.swap(it->second.waiting);
        remotes_.erase(it);  // the next operation asks again
      }
    }
    for (const std::shared_ptr<Transfer>& t : waiting) Transfers::instance().finish(t, sent);
  }

  static void run(const std::shared_ptr<Transfer>& transfer, std::shared_ptr<const SegmentMapping> map,
                  uint32_t slots) {
    run_job(transfer->length, [transfer, map = std::move(map), slots] {
      Attempt attempt;
      absl::Status copied;
      const bool ran = Transfers::instance().copy_if_live(
          transfer,
          [&] {
            attempt = copy_one_sided(*map, slots, transfer->remote.owner, transfer->remote.pid, transfer->remote.id,
                                     OneSidedRef{transfer->remote.table_slot, transfer->remote.table_generation},
                                     transfer->bytes, transfer->write, transfer->offset, transfer->length);
            return attempt.status;
          },
          &copied);
      if (!ran) return;
      if (attempt.fall_back) return fall_back(transfer);
      if (!copied.ok()) return Transfers::instance().finish(transfer, copied);
      Transfers::instance().finish(transfer, RdmaResult{transfer->length, RdmaTransport::kSingleCopy});
    });
  }

  // Where a one-sided copy is not possible: the transfer's next route.
  static void fall_back(const std::shared_ptr<Transfer>& transfer) { link::start_next(transfer); }

  detail::Mutex mu_;
  absl::flat_hash_map<ProcId, Remote> remotes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

bool one_sided_enabled() {
  if (!CASTMESH_LINUX_FACILITIES || !link::single_copy_usable()) return false;
  const config::Config& settings = config::global();
  return settings.rdma_one_sided && settings.rdma_single_copy;
}

OneSidedRef one_sided_publish(const Registration& registration) { return Owner::instance().publish(registration); }

void one_sided_retire(std::shared_ptr<const Registration> registration) {
  Owner::instance().retire(std::move(registration));
}

void one_sided_on_table_open(proc::ProcHost& host, const ProcId& peer, const v1::RdmaHeader& header) {
  Owner::instance().on_table_open(host, peer, header);
}

void one_sided_on_table(proc::ProcHost& host, const ProcId& owner, const v1::RdmaHeader& header) {
  Requester::instance().on_table(host, owner, header);
}

namespace {

// One-sided copies below this size run on the calling thread (larger ones
// on a thread of their own, under a timeout, as every transfer): a 4 MiB
// copy takes a few hundred microseconds, less than what handing it to a
// thread and waking the caller costs at 1 MiB on a loaded machine.
constexpr size_t kOneSidedInCallerBytes = size_t{4} << 20;

class TableLink final : public link::Link {
 public:
  link::Path path(const ProcId&) const override { return link::Path::kSingleCopy; }
  link::Capabilities capabilities() const override {
    link::Capabilities caps;
    caps.one_sided = true;
    caps.zero_copy = true;
    return caps;
  }
  void start(const std::shared_ptr<link::Transfer>& transfer) override {
    // Re-read: a refusal since the route was chosen turns it off.
    if (transfer->release || !one_sided_enabled()) return link::start_next(transfer);
    transfer->transport = RdmaTransport::kSingleCopy;  // nothing else reads it before the first message goes
    Requester::instance().begin(transfer);
  }
  std::optional<absl::Status> start_now(const link::Region& remote, uint64_t offset, char* local, size_t length,
                                        bool write) override {
    if (length >= kOneSidedInCallerBytes) return std::nullopt;
    uint32_t slots = 0;
    std::shared_ptr<const SegmentMapping> map = Requester::instance().ready(remote.owner, remote.pid, &slots);
    if (map == nullptr) return std::nullopt;
    Attempt attempt = copy_one_sided(*map, slots, remote.owner, remote.pid, remote.id,
                                     OneSidedRef{remote.table_slot, remote.table_generation}, local, write, offset,
                                     length);
    if (attempt.fall_back) return std::nullopt;
    return attempt.status;
  }
};

}  // namespace

link::Link& table_link() {
  static auto* table = new TableLink;
  return *table;
}

void one_sided_peer_lost(const ProcId& peer) {
  Owner::instance().peer_lost(peer);
  Requester::instance().peer_lost(peer);
}

}  // namespace castmesh::rdma
