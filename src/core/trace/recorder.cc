// The per-thread rings of the trace recorder (recorder.h).
#include "core/trace/recorder.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <fstream>
#include <memory>
#include <random>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "castmesh/detail/mutex.h"

namespace castmesh::trace {

namespace internal {
std::atomic<bool> g_recording{false};
}  // namespace internal

namespace {

using detail::Mutex;
using detail::MutexLock;

// A Record is stored as this many 64-bit words (relaxed atomics: a reader
// may copy a slot while its writer overwrites it, and discards it after).
constexpr size_t kWords = 6;

// One thread's records. `claimed` is advanced before a slot is written (with
// a release fence after it) and `head` after: a reader that copied slot i
// and then (after an acquire fence) sees claimed > i + capacity knows the
// copy may be torn and drops it.
struct Ring {
  Ring(uint64_t capacity, pid_t tid, std::string name)
      : capacity(capacity), words(new std::atomic<uint64_t>[capacity * kWords]), tid(tid), name(std::move(name)) {}

  const uint64_t capacity;
  const std::unique_ptr<std::atomic<uint64_t>[]> words;
  std::atomic<uint64_t> claimed{0};
  std::atomic<uint64_t> head{0};
  const pid_t tid;
  const std::string name;  // when the ring was made
  std::atomic<bool> alive{true};
  // Next record a reader takes, and what it counted as dropped so far.
  // Reader side only (under the registry's lock).
  uint64_t read = 0;
};

class Registry {
 public:
  static Registry& get() {
    static Registry& registry = *new Registry();  // never destroyed: threads may record during exit
    return registry;
  }

  std::shared_ptr<Ring> make_ring(pid_t tid, std::string name) {
    MutexLock lock(mu_);
    auto ring = std::make_shared<Ring>(capacity_, tid, std::move(name));
    rings_.push_back(ring);
    return ring;
  }

  void start(uint64_t capacity) {
    MutexLock lock(mu_);
    if (capacity >= 16) capacity_ = capacity;  // at least a few records per thread
    // Records of an earlier trace are not this trace's.
    for (const std::shared_ptr<Ring>& ring : rings_) ring->read = ring->head.load(std::memory_order_acquire);
    std::erase_if(rings_, [](const std::shared_ptr<Ring>& ring) { return !ring->alive.load(); });
  }

  std::vector<ThreadRecords> take() {
    MutexLock lock(mu_);
    std::vector<ThreadRecords> out;
    std::vector<Ring*> finished;  // ended before their last records were read: nothing more will come
    for (const std::shared_ptr<Ring>& ring : rings_) {
      if (!ring->alive.load()) finished.push_back(ring.get());
      out.push_back(take_from(*ring));
    }
    std::erase_if(rings_, [&](const std::shared_ptr<Ring>& ring) {
      return std::find(finished.begin(), finished.end(), ring.get()) != finished.end();
    });
    return out;
  }

  uint32_t intern(std::string_view text) {
    if (text.empty()) return 0;
    MutexLock lock(mu_);
    auto it = ids_.find(absl::string_view(text.data(), text.size()));
    if (it != ids_.end()) return it->second;
    texts_.emplace_back(text);
    const auto id = static_cast<uint32_t>(texts_.size() - 1);
    ids_.emplace(absl::string_view(texts_.back()), id);
    return id;
  }

  std::vector<std::string> texts() {
    MutexLock lock(mu_);
    return {texts_.begin(), texts_.end()};
  }

 private:
  Registry() { texts_.emplace_back(); }

  static ThreadRecords take_from(Ring& ring) {
    ThreadRecords out;
    out.tid = ring.tid;
    out.name = ring.name;
    if (ring.alive.load()) {
      std::ifstream comm(absl::StrCat("/proc/self/task/", ring.tid, "/comm"));
      std::string now;
      if (std::getline(comm, now) && !now.empty()) out.name = now;
    }
    const uint64_t head = ring.head.load(std::memory_order_acquire);
    uint64_t from = ring.read;
    if (head > ring.capacity && head - ring.capacity > from) {
      out.dropped += head - ring.capacity - from;
      from = head - ring.capacity;
    }
    std::vector<std::array<uint64_t, kWords>> copied;
    copied.reserve(head - from);
    for (uint64_t i = from; i < head; ++i) {
      std::array<uint64_t, kWords> w;
      const std::atomic<uint64_t>* slot = &ring.words[(i % ring.capacity) * kWords];
      for (size_t k = 0; k < kWords; ++k) w[k] = slot[k].load(std::memory_order_relaxed);
      copied.push_back(w);
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    const uint64_t claimed = ring.claimed.load(std::memory_order_relaxed);
    // Slots a later record claimed while they were copied may be torn.
    const uint64_t valid_from = claimed > ring.capacity ? std::max(from, claimed - ring.capacity) : from;
    out.dropped += std::min(valid_from, head) - from;
    for (uint64_t i = std::max(from, valid_from); i < head; ++i) {
      const std::array<uint64_t, kWords>& w = copied[i - from];
      Record r;
      r.start_ns = static_cast<int64_t>(w[0]);
      r.duration_ns = static_cast<int64_t>(w[1]);
      r.flow = w[2];
      r.value = w[3];
      r.name = static_cast<uint32_t>(w[4] >> 32);
      r.detail = static_cast<uint32_t>(w[4]);
      r.category = static_cast<Category>(w[5] & 0xff);
      r.kind = static_cast<RecordKind>((w[5] >> 8) & 0xff);
      out.records.push_back(r);
    }
    ring.read = head;
    return out;
  }

  Mutex mu_;
  uint64_t capacity_ ABSL_GUARDED_BY(mu_) = 16384;
  std::vector<std::shared_ptr<Ring>> rings_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> texts_ ABSL_GUARDED_BY(mu_);  // a deque: ids_' keys view its strings
  absl::flat_hash_map<absl::string_view, uint32_t> ids_ ABSL_GUARDED_BY(mu_);
};

std::string current_thread_name() {
  char name[32] = {};
  if (pthread_getname_np(pthread_self(), name, sizeof(name)) != 0) return "";
  return name;
}

// The calling thread's ring; marks it ended when the thread exits.
struct ThreadRing {
  std::shared_ptr<Ring> ring;
  ~ThreadRing() {
    if (ring != nullptr) ring->alive.store(false);
  }
};
thread_local ThreadRing t_ring;

}  // namespace

std::string_view category_name(Category category) {
  switch (category) {
    case Category::kHandler:
      return "handler";
    case Category::kSend:
      return "send";
    case Category::kReceive:
      return "receive";
    case Category::kCast:
      return "cast";
    case Category::kSpawn:
      return "spawn";
    case Category::kSupervision:
      return "supervision";
    case Category::kCollective:
      return "collective";
    case Category::kRdma:
      return "rdma";
    case Category::kUser:
      return "user";
  }
  return "other";
}

void set_recording(bool on, uint64_t ring_records) {
  if (on) Registry::get().start(ring_records);
  internal::g_recording.store(on, std::memory_order_release);
}

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

uint32_t intern(std::string_view text) { return Registry::get().intern(text); }

uint32_t intern_cached(std::string_view text) {
  thread_local absl::flat_hash_map<std::string, uint32_t> ids;
  auto it = ids.find(absl::string_view(text.data(), text.size()));
  if (it == ids.end()) it = ids.emplace(std::string(text), intern(text)).first;
  return it->second;
}

uint64_t new_flow_id() {
  static const uint64_t prefix = [] {
    std::random_device random;
    return (uint64_t{random()} & 0xffffff) << 40;
  }();
  static std::atomic<uint64_t> next{1};
  return prefix | (next.fetch_add(1, std::memory_order_relaxed) & ((uint64_t{1} << 40) - 1));
}

void record(const Record& r) {
  if (!on()) return;
  Ring* ring = t_ring.ring.get();
  if (ring == nullptr) {
    t_ring.ring = Registry::get().make_ring(static_cast<pid_t>(::syscall(SYS_gettid)), current_thread_name());
    ring = t_ring.ring.get();
  }
  const uint64_t h = ring->head.load(std::memory_order_relaxed);
  ring->claimed.store(h + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  std::atomic<uint64_t>* slot = &ring->words[(h % ring->capacity) * kWords];
  slot[0].store(static_cast<uint64_t>(r.start_ns), std::memory_order_relaxed);
  slot[1].store(static_cast<uint64_t>(r.duration_ns), std::memory_order_relaxed);
  slot[2].store(r.flow, std::memory_order_relaxed);
  slot[3].store(r.value, std::memory_order_relaxed);
  slot[4].store((uint64_t{r.name} << 32) | r.detail, std::memory_order_relaxed);
  slot[5].store(static_cast<uint64_t>(r.category) | (static_cast<uint64_t>(r.kind) << 8), std::memory_order_relaxed);
  ring->head.store(h + 1, std::memory_order_release);
}

namespace {
thread_local uint64_t t_inbound_flow = 0;
}  // namespace

void set_inbound_flow(uint64_t flow) { t_inbound_flow = flow; }
uint64_t take_inbound_flow() { return std::exchange(t_inbound_flow, 0); }

namespace {
thread_local uint32_t t_handler_name = 0;
}  // namespace

void name_current_handler(uint32_t name) { t_handler_name = name; }
uint32_t take_handler_name() { return std::exchange(t_handler_name, 0); }

std::vector<ThreadRecords> take_records() { return Registry::get().take(); }

std::vector<std::string> interned_texts() { return Registry::get().texts(); }

}  // namespace castmesh::trace
