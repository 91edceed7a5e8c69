// Message memory: per-thread free lists by size class. A message is usually
// allocated by its sender and freed by its receiver, so each thread's list
// would drain on one side and grow on the other; full batches move between
// threads through a shared depot (one lock per kBatch blocks).
//
// Fresh blocks are carved kBatch at a time from large regions mapped once
// and kept for the life of the process (like the blocks in the lists: this
// memory is a cache that only grows to the most messages ever in flight).
// Carving kBatch blocks under one lock replaces a malloc per block (and the
// depot lock that every allocation took while the depot was empty) when a
// receiver falls behind its senders and hundreds of thousands of messages
// are in flight; a burst of sends also walks memory forward. The page
// faults of fresh memory remain (about half of an N:1 burst's time on the
// 2-vCPU VM of bench/RESULTS.md). Transparent huge pages
// (MADV_HUGEPAGE on 2 MiB-aligned regions) removed them when the host had
// the memory backed, but made a cold run 20x slower on that VM (the host
// faults in each huge page the guest kernel clears), so they are not used.
//
// The thread-local lists are plain data with the initial-exec TLS model (a
// few dozen bytes of static TLS; a `%fs`-relative load instead of a
// __tls_get_addr call per message in this shared library). Their flush at
// thread exit is registered separately, on a thread's first slow path.
#include <sys/mman.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "castmesh/detail/envelope.h"
#include "castmesh/detail/mutex.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CASTMESH_MESSAGE_POOL 0
#else
#define CASTMESH_MESSAGE_POOL 1
#endif

namespace castmesh::detail {

#if CASTMESH_MESSAGE_POOL
namespace {

constexpr std::array<std::size_t, 4> kClassSize = {64, 128, 256, 512};
constexpr std::size_t kClasses = kClassSize.size();
constexpr std::size_t kBatch = 64;
constexpr std::size_t kMaxLocal = 4 * kBatch;
constexpr std::size_t kFirstRegionBytes = std::size_t{256} << 10;  // small programs stay small
constexpr std::size_t kRegionBytes = std::size_t{2} << 20;

int size_class(std::size_t n) {
  for (std::size_t c = 0; c < kClasses; ++c) {
    if (n <= kClassSize[c]) return static_cast<int>(c);
  }
  return -1;
}

struct FreeBlock {
  FreeBlock* next;
};

struct Chain {
  FreeBlock* head = nullptr;
  std::size_t count = 0;
};

// Shared by all threads; `mu` is taken once per kBatch blocks.
struct Depot {
  detail::Mutex mu;
  std::array<std::vector<Chain>, kClasses> chains ABSL_GUARDED_BY(mu);
  char* region_next ABSL_GUARDED_BY(mu) = nullptr;
  char* region_end ABSL_GUARDED_BY(mu) = nullptr;
  std::size_t regions ABSL_GUARDED_BY(mu) = 0;
};

Depot& depot() {
  static Depot* d = new Depot();  // never destroyed: threads may exit after static destruction
  return *d;
}

// Maps a new region; nullptr if the kernel refuses.
char* map_region(std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

// Reserves room for kBatch fresh blocks of class c; nullptr if the kernel
// refused memory. Touches no page of the room: the first touch faults
// (several microseconds per page on a VM), and other threads must not wait
// for that on d.mu.
char* reserve_batch(Depot& d, int c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d.mu) {
  const std::size_t bytes = kClassSize[c] * kBatch;
  if (static_cast<std::size_t>(d.region_end - d.region_next) < bytes) {
    const std::size_t region_bytes = d.regions == 0 ? kFirstRegionBytes : kRegionBytes;
    char* r = map_region(region_bytes);
    if (r == nullptr) return nullptr;
    ++d.regions;
    d.region_next = r;
    d.region_end = r + region_bytes;  // the old region's tail (< one batch) is left unused
  }
  char* p = d.region_next;
  d.region_next += bytes;
  return p;
}

// Links the kBatch blocks of class c at `p` (from reserve_batch) into a
// chain, in address order so a burst of allocations walks memory forward.
Chain carve(char* p, int c) {
  const std::size_t size = kClassSize[c];
  Chain out;
  for (std::size_t i = kBatch; i-- > 0;) {
    auto* b = reinterpret_cast<FreeBlock*>(p + i * size);
    b->next = out.head;
    out.head = b;
  }
  out.count = kBatch;
  return out;
}

void depot_put(Depot& d, int c, Chain chain) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d.mu) {
  d.chains[c].push_back(chain);
}

// A chain of class c from the depot, or fresh blocks. Never empty unless
// the kernel refused memory.
Chain depot_take(int c) {
  Depot& d = depot();
  char* fresh = nullptr;
  {
    detail::MutexLock lock(d.mu);
    if (!d.chains[c].empty()) {
      Chain chain = d.chains[c].back();
      d.chains[c].pop_back();
      return chain;
    }
    fresh = reserve_batch(d, c);
  }
  return fresh == nullptr ? Chain{} : carve(fresh, c);
}

// A thread's free lists. Plain data (zero-initialised static TLS, no guard
// on access); `state` says whether the exit flush is registered.
enum class CacheState : uint8_t { kNew, kActive, kGone };
struct LocalCache {
  std::array<Chain, kClasses> lists{};
  CacheState state = CacheState::kNew;
};
// constinit: constant-initialised, so no TLS init guard (itself a
// general-dynamic TLS variable) is checked on each access.
__attribute__((tls_model("initial-exec"))) constinit thread_local LocalCache tl_cache;

// Gives a thread's blocks to the depot when the thread exits.
struct LocalCacheFlush {
  LocalCacheFlush() { tl_cache.state = CacheState::kActive; }
  ~LocalCacheFlush() {
    tl_cache.state = CacheState::kGone;
    Depot& d = depot();
    detail::MutexLock lock(d.mu);
    for (std::size_t c = 0; c < kClasses; ++c) {
      Chain& list = tl_cache.lists[c];
      if (list.count > 0) depot_put(d, static_cast<int>(c), list);
      list = Chain{};
    }
  }
};

// Slow path of a thread whose cache is not active: registers the flush on
// first use; false once the thread is exiting (its cache is gone).
bool activate_local_cache() {
  if (tl_cache.state == CacheState::kNew) {
    thread_local LocalCacheFlush flush;  // constructing it sets kActive
    (void)flush;
  }
  return tl_cache.state == CacheState::kActive;
}

void* take_one(Chain& list) {
  FreeBlock* b = list.head;
  list.head = b->next;
  --list.count;
  // A recycled block was last written by the thread that freed it (usually
  // the receiver, on another core): fetch the next one for writing now, so
  // that its transfer overlaps the work until the next allocation.
  if (list.head != nullptr) __builtin_prefetch(list.head, 1);
  return b;
}

}  // namespace

void* allocate_message_memory(std::size_t size) {
  const int c = size_class(size);
  if (c < 0) return ::operator new(size);
  Chain& list = tl_cache.lists[c];
  if (list.head != nullptr) [[likely]] return take_one(list);
  if (!activate_local_cache()) {
    // Exiting thread: one block straight from the depot, the rest given back.
    Chain chain = depot_take(c);
    if (chain.head == nullptr) throw std::bad_alloc();
    void* b = take_one(chain);
    if (chain.count > 0) {
      Depot& d = depot();
      detail::MutexLock lock(d.mu);
      depot_put(d, c, chain);
    }
    return b;
  }
  list = depot_take(c);
  if (list.head == nullptr) throw std::bad_alloc();
  return take_one(list);
}

void free_message_memory(void* p, std::size_t size) noexcept {
  if (p == nullptr) return;
  const int c = size_class(size);
  if (c < 0) {
    ::operator delete(p);
    return;
  }
  auto* b = static_cast<FreeBlock*>(p);
  if (tl_cache.state != CacheState::kActive) [[unlikely]] {
    if (!activate_local_cache()) {
      b->next = nullptr;
      Depot& d = depot();
      detail::MutexLock lock(d.mu);
      depot_put(d, c, Chain{b, 1});
      return;
    }
  }
  Chain& list = tl_cache.lists[c];
  b->next = list.head;
  list.head = b;
  if (++list.count < kMaxLocal) [[likely]] return;
  // Hand one batch to the depot for the threads that allocate.
  Chain out;
  for (std::size_t i = 0; i < kBatch; ++i) {
    FreeBlock* x = list.head;
    list.head = x->next;
    x->next = out.head;
    out.head = x;
  }
  out.count = kBatch;
  list.count -= kBatch;
  Depot& d = depot();
  detail::MutexLock lock(d.mu);
  depot_put(d, c, out);
}

#else

void* allocate_message_memory(std::size_t size) { return ::operator new(size); }
void free_message_memory(void* p, std::size_t) noexcept { ::operator delete(p); }

#endif

}  // namespace castmesh::detail
