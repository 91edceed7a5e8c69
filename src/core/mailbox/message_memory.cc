// Message memory: per-thread free lists by size class. A message is usually
// allocated by its sender and freed by its receiver, so each thread's list
// would drain on one side and grow on the other; full batches move between
// threads through a shared depot (one lock per kBatch blocks). Every block is
// one ::operator new of its class size, so any block may also be handed back
// with ::operator delete (used after a thread's cache is gone).
#include <array>
#include <cstddef>
#include <mutex>
#include <new>
#include <vector>

#include "castmesh/detail/envelope.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CASTMESH_MESSAGE_POOL 0
#else
#define CASTMESH_MESSAGE_POOL 1
#endif

namespace castmesh::detail {

#if CASTMESH_MESSAGE_POOL
namespace {

constexpr std::array<std::size_t, 4> kClassSize = {64, 128, 256, 512};
constexpr std::size_t kBatch = 64;
constexpr std::size_t kMaxLocal = 4 * kBatch;

int size_class(std::size_t n) {
  for (std::size_t c = 0; c < kClassSize.size(); ++c) {
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

struct Depot {
  std::mutex mu;
  std::array<std::vector<Chain>, kClassSize.size()> chains;
};

Depot& depot() {
  static Depot* d = new Depot();  // never destroyed: threads may exit after static destruction
  return *d;
}

struct LocalCache {
  std::array<Chain, kClassSize.size()> lists;
  bool alive = true;

  ~LocalCache() {
    alive = false;
    Depot& d = depot();
    std::lock_guard<std::mutex> lock(d.mu);
    for (std::size_t c = 0; c < lists.size(); ++c) {
      if (lists[c].count > 0) d.chains[c].push_back(lists[c]);
      lists[c] = Chain{};
    }
  }
};

thread_local LocalCache tl_cache;

}  // namespace

void* allocate_message_memory(std::size_t size) {
  const int c = size_class(size);
  if (c < 0 || !tl_cache.alive) return ::operator new(c < 0 ? size : kClassSize[c]);
  Chain& list = tl_cache.lists[c];
  if (list.head == nullptr) {
    Depot& d = depot();
    std::lock_guard<std::mutex> lock(d.mu);
    if (!d.chains[c].empty()) {
      list = d.chains[c].back();
      d.chains[c].pop_back();
    }
  }
  if (list.head == nullptr) return ::operator new(kClassSize[c]);
  FreeBlock* b = list.head;
  list.head = b->next;
  --list.count;
  return b;
}

void free_message_memory(void* p, std::size_t size) noexcept {
  if (p == nullptr) return;
  const int c = size_class(size);
  if (c < 0 || !tl_cache.alive) {
    ::operator delete(p);
    return;
  }
  Chain& list = tl_cache.lists[c];
  auto* b = static_cast<FreeBlock*>(p);
  b->next = list.head;
  list.head = b;
  if (++list.count < kMaxLocal) return;
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
  std::lock_guard<std::mutex> lock(d.mu);
  d.chains[c].push_back(out);
}

#else

void* allocate_message_memory(std::size_t size) { return ::operator new(size); }
void free_message_memory(void* p, std::size_t) noexcept { ::operator delete(p); }

#endif

}  // namespace castmesh::detail
