// The process-wide tables of counters.h.
#include "core/metrics/counters.h"

#include <algorithm>

#include "castmesh/detail/mutex.h"

namespace castmesh::metrics {
namespace {

struct alignas(64) AlignedFlow {
  FlowCounters counters;
};

std::array<AlignedFlow, kTransports>& transports() {
  static std::array<AlignedFlow, kTransports> table;
  return table;
}

struct alignas(64) PathSlot {
  FlowCounters counters;
  std::atomic<const char*> name{nullptr};  // static storage (link::path_name)
  std::atomic<size_t> name_size{0};
};

std::array<PathSlot, kMaxPaths>& path_slots() {
  static std::array<PathSlot, kMaxPaths> table;
  return table;
}

// These tables are touched when communicators come and go
// and when a new kind or a snapshot is taken, never per call.
struct Kinds {
  detail::Mutex mu;
  std::vector<std::string> names ABSL_GUARDED_BY(mu);  // by slot
};
Kinds& kinds() {
  static Kinds* table = new Kinds;  // outlives static destructors of communicators
  return *table;
}

struct Communicators {
  detail::Mutex mu;
  std::vector<CommunicatorCounters*> live ABSL_GUARDED_BY(mu);
};
Communicators& communicators() {
  static Communicators* table = new Communicators;
  return *table;
}

}  // namespace

Transport transport_of(std::string_view proc_id) {
  if (proc_id.starts_with("unix:")) return Transport::kUnix;
  if (proc_id.starts_with("tcp:")) return Transport::kTcp;
  return Transport::kOther;
}

std::string_view transport_name(Transport transport) {
  switch (transport) {
    case Transport::kUnix:
      return "unix";
    case Transport::kTcp:
      return "tcp";
    case Transport::kOther:
      break;
  }
  return "other";
}

FlowCounters& transport(Transport transport) { return transports()[static_cast<size_t>(transport)].counters; }

void count_path(unsigned index, std::string_view name, bool outbound, uint64_t bytes) {
  if (index >= kMaxPaths) return;
  PathSlot& slot = path_slots()[index];
  if (slot.name.load(std::memory_order_relaxed) == nullptr) {
    slot.name_size.store(name.size(), std::memory_order_relaxed);
    slot.name.store(name.data(), std::memory_order_release);
  }
  if (outbound) {
    slot.counters.out(bytes);
  } else {
    slot.counters.in(bytes);
  }
}

std::vector<std::pair<std::string, const FlowCounters*>> paths() {
  std::vector<std::pair<std::string, const FlowCounters*>> out;
  for (const PathSlot& slot : path_slots()) {
    const char* name = slot.name.load(std::memory_order_acquire);
    if (name == nullptr) continue;
    out.emplace_back(std::string(name, slot.name_size.load(std::memory_order_relaxed)), &slot.counters);
  }
  return out;
}

size_t collective_kind(std::string_view name) {
  Kinds& table = kinds();
  detail::MutexLock lock(table.mu);
  auto it = std::find(table.names.begin(), table.names.end(), name);
  if (it != table.names.end()) return static_cast<size_t>(it - table.names.begin());
  if (table.names.size() + 1 >= kMaxCollectiveKinds) return kMaxCollectiveKinds - 1;
  table.names.emplace_back(name);
  return table.names.size() - 1;
}

std::string collective_kind_name(size_t slot) {
  Kinds& table = kinds();
  detail::MutexLock lock(table.mu);
  return slot < table.names.size() ? table.names[slot] : "other";
}

CommunicatorCounters::CommunicatorCounters(std::string description, int rank, int size)
    : description_(std::move(description)), rank_(rank), size_(size) {
  Communicators& table = communicators();
  detail::MutexLock lock(table.mu);
  table.live.push_back(this);
}

CommunicatorCounters::~CommunicatorCounters() {
  Communicators& table = communicators();
  detail::MutexLock lock(table.mu);
  std::erase(table.live, this);
}

void CommunicatorCounters::for_each(const std::function<void(const CommunicatorCounters&)>& fn) {
  Communicators& table = communicators();
  detail::MutexLock lock(table.mu);
  for (const CommunicatorCounters* c : table.live) fn(*c);
}

}  // namespace castmesh::metrics
