#include "core/shm_link/shm_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <set>

#include "castmesh/detail/mutex.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/platform/platform.h"
#include "core/scheduler/futex.h"

namespace castmesh::shm_link {

namespace {
constexpr uint64_t kMagic = 0x676e69726d736d63ULL;  // "cmsmring"
constexpr uint32_t kVersion = 3;  // 2: the waiter bell; 3: pollers on a line of its own
constexpr size_t kMinCapacity = 4096;
constexpr size_t kMaxCapacity = size_t{256} << 20;
constexpr size_t kAlign = 16;
constexpr uint32_t kSkip = 0;

size_t align_up(size_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }
bool power_of_two(uint64_t n) { return n != 0 && (n & (n - 1)) == 0; }

std::string random_name() {
  std::random_device rd;  // the kernel's entropy: the name is the only guard besides mode 0600
  // 96 random bits; 28 characters in all, within macOS's 31 for shm names.
  std::string name = "/cm-";
  for (int i = 0; i < 3; ++i) absl::StrAppend(&name, absl::Hex(rd(), absl::kZeroPad8));
  return name;
}

// Names this process created and has not unlinked yet: unlinked at exit,
// so a peer that never mapped its segment (it died first) leaks nothing
// when this process ends normally. (A SIGKILL in that window still leaks:
// the unlinks on accept and on peer loss keep it short.)
struct CreatedNames {
  detail::Mutex mu;
  std::set<std::string> names ABSL_GUARDED_BY(mu);
};
CreatedNames& created_names() {
  static auto* created = [] {
    auto* c = new CreatedNames;
    std::atexit([] {
      CreatedNames& names = created_names();
      detail::MutexLock lock(names.mu);
      for (const std::string& n : names.names) ::shm_unlink(n.c_str());
      names.names.clear();
    });
    return c;
  }();
  return *created;
}

absl::Status errno_status(const std::string& what) {
  const int e = errno;
  std::string msg = absl::StrCat(what, ": ", std::strerror(e));
  if (e == ENOENT) return absl::NotFoundError(msg);
  if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(msg);
  return absl::UnavailableError(msg);
}
}  // namespace

// The segment's first page: the header, then the ring's indices and the
// doorbell, each on its own cache line. Records follow at kHeaderBytes.
struct ShmRing::Layout {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint64_t capacity;
  alignas(64) std::atomic<uint64_t> head;  // consumer: bytes read
  alignas(64) std::atomic<uint64_t> tail;  // producer: bytes written
  alignas(64) std::atomic<uint32_t> doorbell;
  std::atomic<uint32_t> sleeping;
  // On a line of its own: consumer threads write it at every wait they spin
  // through, and the producer reads `sleeping` at every record (pollers only
  // when that is set), so sharing a line cost the producer a miss per record.
  alignas(64) std::atomic<uint32_t> pollers;
  // Consumer threads asleep on waiter_bell (they read the ring themselves).
  alignas(64) std::atomic<uint32_t> waiter_bell;
  std::atomic<uint32_t> waiter_sleepers;
};

namespace {
constexpr size_t kHeaderBytes = 4096;
// Both ends map the whole ring at once: otherwise every page faults the
// first time the records reach it, on the producer and on the consumer,
// which made the first lap of a ring (about 900 records of 1 KiB) cost 2-3x
// per message (measured: 2.1-3.9 us per 1 KiB allreduce for the first 900
// calls of a 2-rank job, 0.65 after). Where the system has no such flag
// the pages fault in as before.
#if CASTMESH_LINUX_FACILITIES
constexpr int kPrefault = MAP_POPULATE;
#else
constexpr int kPrefault = 0;
#endif
// Systems with larger pages (macOS on arm64: 16 KiB) round a segment's size up.
constexpr size_t kSizeSlack = 64 * 1024;
static_assert(sizeof(std::atomic<uint64_t>) == 8 && std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
}  // namespace

ShmRing::ShmRing(std::string name, void* base, size_t mapped, size_t capacity, bool creator)
    : name_(std::move(name)),
      base_(base),
      mapped_(mapped),
      layout_(static_cast<Layout*>(base)),
      data_(static_cast<char*>(base) + kHeaderBytes),
      capacity_(capacity),
      creator_(creator) {
  static_assert(sizeof(Layout) <= kHeaderBytes);
}

ShmRing::~ShmRing() {
  if (creator_) unlink();
  if (base_ != nullptr) ::munmap(base_, mapped_);
}

void ShmRing::unlink() {
  if (unlinked_) return;
  unlinked_ = true;
  (void)::shm_unlink(name_.c_str());  // ENOENT: the other side already did
  if (creator_) {
    CreatedNames& created = created_names();
    detail::MutexLock lock(created.mu);
    created.names.erase(name_);
  }
}

absl::StatusOr<std::unique_ptr<ShmRing>> ShmRing::Create(size_t capacity) {
  if (!power_of_two(capacity) || capacity < kMinCapacity || capacity > kMaxCapacity) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm ring capacity ", capacity, " is not a power of two in ", kMinCapacity, "..", kMaxCapacity));
  }
  std::string name;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    name = random_name();
    fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno != EEXIST) return errno_status(absl::StrCat("shm_open(", name, ")"));
  }
  if (fd < 0) return absl::UnavailableError("shm_open: no free random name after 8 attempts");
  const size_t size = kHeaderBytes + capacity;
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    absl::Status st = errno_status(absl::StrCat("ftruncate(", name, ")"));
    ::close(fd);
    ::shm_unlink(name.c_str());
    return st;
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | kPrefault, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    absl::Status st = errno_status(absl::StrCat("mmap(", name, ")"));
    ::shm_unlink(name.c_str());
    return st;
  }
  {
    CreatedNames& created = created_names();
    detail::MutexLock lock(created.mu);
    created.names.insert(name);
  }
  auto* layout = new (base) Layout{};
  layout->magic = kMagic;
  layout->version = kVersion;
  layout->header_bytes = kHeaderBytes;
  layout->capacity = capacity;
  std::atomic_thread_fence(std::memory_order_release);
  return std::unique_ptr<ShmRing>(new ShmRing(std::move(name), base, size, capacity, /*creator=*/true));
}

absl::StatusOr<std::unique_ptr<ShmRing>> ShmRing::Open(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos || name.size() > 200) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a shm segment name"));
  }
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return errno_status(absl::StrCat("shm_open(", name, ")"));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    absl::Status s = errno_status(absl::StrCat("fstat(", name, ")"));
    ::close(fd);
    return s;
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < kHeaderBytes + kMinCapacity || size > kHeaderBytes + kMaxCapacity + kSizeSlack) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("shm segment ", name, " has ", size, " bytes, not a ring's size"));
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | kPrefault, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) return errno_status(absl::StrCat("mmap(", name, ")"));
  std::atomic_thread_fence(std::memory_order_acquire);
  const auto* layout = static_cast<const Layout*>(base);
  std::string bad;
  if (layout->magic != kMagic) {
    bad = absl::StrFormat("bad magic %#x", layout->magic);
  } else if (layout->version != kVersion) {
    bad = absl::StrCat("version ", layout->version, " (this build reads ", kVersion, ")");
  } else if (layout->header_bytes != kHeaderBytes) {
    bad = absl::StrCat("header of ", layout->header_bytes, " bytes (expected ", kHeaderBytes, ")");
  } else if (!power_of_two(layout->capacity) || layout->capacity + kHeaderBytes > size ||
             size - layout->capacity - kHeaderBytes > kSizeSlack) {
    bad = absl::StrCat("capacity ", layout->capacity, " does not match its size of ", size, " bytes");
  } else if (layout->tail.load() - layout->head.load() > layout->capacity) {
    bad = "indices out of range";
  }
  if (!bad.empty()) {
    ::munmap(base, size);
    return absl::InvalidArgumentError(absl::StrCat("shm segment ", name, " is not a castmesh ring: ", bad));
  }
  const size_t capacity = layout->capacity;
  return std::unique_ptr<ShmRing>(new ShmRing(name, base, size, capacity, /*creator=*/false));
}

bool ShmRing::try_write(uint32_t kind, std::string_view meta, std::string_view body) {
  const size_t payload = meta.size() + body.size();
  if (kind == kSkip || kind > kMaxKind || payload > max_payload()) return false;
  const size_t bytes = align_up(kRecordHeaderBytes + payload);
  const uint64_t tail = layout_->tail.load(std::memory_order_relaxed);
  size_t pos = tail & (capacity_ - 1);
  const size_t to_end = capacity_ - pos;
  const size_t skip = bytes <= to_end ? 0 : to_end;
  // The consumer's head moves only forward: the last one read bounds the
  // free space from below, and reading it again (a cache line the consumer
  // writes at every record, so a miss) is needed only when that bound is short.
  if (tail - cached_head_ + skip + bytes > capacity_) {
    cached_head_ = layout_->head.load(std::memory_order_acquire);
    if (tail - cached_head_ + skip + bytes > capacity_) return false;
  }
  if (skip != 0) {
    const uint32_t head_words[4] = {static_cast<uint32_t>(skip), kSkip, 0, 0};
    std::memcpy(data_ + pos, head_words, sizeof head_words);
    pos = 0;
  }
  const uint32_t words[4] = {static_cast<uint32_t>(kRecordHeaderBytes + payload), kind,
                             static_cast<uint32_t>(meta.size()), 0};
  char* at = data_ + pos;
  std::memcpy(at, words, sizeof words);
  if (!meta.empty()) std::memcpy(at + kRecordHeaderBytes, meta.data(), meta.size());
  if (!body.empty()) std::memcpy(at + kRecordHeaderBytes + meta.size(), body.data(), body.size());
  layout_->tail.store(tail + skip + bytes, std::memory_order_release);
  // Dekker with sleep_until_rung/stop_polling: publish, then look whether
  // the consumer sleeps.
  detail::store_load_barrier();
  if (layout_->waiter_sleepers.load(std::memory_order_relaxed) != 0) {
    // A consumer thread that waits for this record sleeps on its own bell:
    // wake it (all of them: each waits for its own request), not the
    // sleeping thread, which would have to hand the record on (a second
    // wake-up).
    layout_->waiter_bell.fetch_add(1, std::memory_order_release);
    detail::futex_wake_shared(&layout_->waiter_bell, INT32_MAX);
  } else if (layout_->sleeping.load(std::memory_order_relaxed) != 0 &&
             layout_->pollers.load(std::memory_order_relaxed) == 0) {
    ring();
  }
  return true;
}

bool ShmRing::readable() const {
  return layout_->tail.load(std::memory_order_acquire) != layout_->head.load(std::memory_order_relaxed);
}

absl::StatusOr<std::optional<ShmRing::Record>> ShmRing::peek() {
  uint64_t head = layout_->head.load(std::memory_order_relaxed);
  const uint64_t tail = layout_->tail.load(std::memory_order_acquire);
  uint64_t skipped = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const uint64_t avail = tail - head;
    if (avail == 0) return std::nullopt;
    const size_t pos = head & (capacity_ - 1);
    if (avail > capacity_ || avail < kRecordHeaderBytes || pos % kAlign != 0) {
      return absl::DataLossError(absl::StrCat("shm ring ", name_, ": indices out of range"));
    }
    uint32_t words[4];
    std::memcpy(words, data_ + pos, sizeof words);
    const size_t bytes = align_up(words[0]);
    if (words[1] == kSkip) {
      if (pass != 0 || words[0] != capacity_ - pos || bytes > avail) {
        return absl::DataLossError(absl::StrCat("shm ring ", name_, ": malformed skip record"));
      }
      head += bytes;
      skipped = bytes;
      continue;
    }
    if (words[0] < kRecordHeaderBytes || bytes > avail || pos + bytes > capacity_ || words[1] > kMaxKind ||
        words[2] > words[0] - kRecordHeaderBytes) {
      return absl::DataLossError(absl::StrCat("shm ring ", name_, ": malformed record of ", words[0], " bytes"));
    }
    const char* at = data_ + pos + kRecordHeaderBytes;
    Record record;
    record.kind = words[1];
    record.meta = std::string_view(at, words[2]);
    record.body = std::string_view(at + words[2], words[0] - kRecordHeaderBytes - words[2]);
    peeked_bytes_ = skipped + bytes;
    return record;
  }
  return absl::DataLossError(absl::StrCat("shm ring ", name_, ": two skip records in a row"));
}

void ShmRing::pop() {
  if (peeked_bytes_ == 0) return;
  // Only the consumer writes head: a plain store, not a locked read-modify-write.
  layout_->head.store(layout_->head.load(std::memory_order_relaxed) + peeked_bytes_, std::memory_order_release);
  peeked_bytes_ = 0;
}

void ShmRing::sleep_until_rung(absl::Time deadline) {
  const uint32_t seen = arm_sleeper();
  if (!readable()) (void)detail::futex_wait_shared(&layout_->doorbell, seen, deadline);
  disarm_sleeper();
}

uint32_t ShmRing::arm_sleeper() {
  const uint32_t seen = layout_->doorbell.load(std::memory_order_acquire);
  layout_->sleeping.store(1, std::memory_order_relaxed);
  detail::store_load_barrier();  // Dekker with try_write: announce, then the caller looks at the ring
  return seen;
}

void ShmRing::disarm_sleeper() { layout_->sleeping.store(0, std::memory_order_relaxed); }

std::atomic<uint32_t>* ShmRing::doorbell() { return &layout_->doorbell; }

void ShmRing::ring() {
  layout_->doorbell.fetch_add(1, std::memory_order_release);
  detail::futex_wake_shared(&layout_->doorbell, 1);
}

uint32_t ShmRing::arm_waiter() {
  const uint32_t seen = layout_->waiter_bell.load(std::memory_order_acquire);
  layout_->waiter_sleepers.fetch_add(1, std::memory_order_seq_cst);
  detail::store_load_barrier();  // Dekker with try_write: count ourselves, then look at the ring
  return seen;
}

void ShmRing::disarm_waiter() { layout_->waiter_sleepers.fetch_sub(1, std::memory_order_relaxed); }

std::atomic<uint32_t>* ShmRing::waiter_bell() { return &layout_->waiter_bell; }

void ShmRing::start_polling() { layout_->pollers.fetch_add(1, std::memory_order_seq_cst); }

bool ShmRing::polled() const { return layout_->pollers.load(std::memory_order_acquire) != 0; }

void ShmRing::stop_polling() {
  layout_->pollers.fetch_sub(1, std::memory_order_seq_cst);
  detail::store_load_barrier();
}

}  // namespace castmesh::shm_link
