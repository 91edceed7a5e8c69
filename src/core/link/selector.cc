#include "core/link/selector.h"

#include "core/link/shm_ring_path.h"
#include "core/platform/process_memory.h"

namespace castmesh::link {

namespace {

bool applies(const CostRow& row, Placement placement, size_t bytes, const Available& available) {
  const bool serves =
      row.reach == placement || (row.reach == Placement::kOtherHost && placement != Placement::kSameProcess);
  return serves && bytes >= row.min_bytes && available.has(row.path);
}

}  // namespace

std::optional<Path> choose(Placement placement, size_t bytes, const Available& available) {
  for (const CostRow& row : kCostTable) {
    if (applies(row, placement, bytes, available)) return row.path;
  }
  return std::nullopt;
}

size_t choose_in_order(Placement placement, size_t bytes, const Available& available, Path* out) {
  size_t n = 0;
  for (const CostRow& row : kCostTable) {
    if (applies(row, placement, bytes, available)) out[n++] = row.path;
  }
  return n;
}

Selector::Selector(std::vector<ProcId> procs, ProcId self, std::weak_ptr<proc::ProcHost> host,
                   std::string description, std::shared_ptr<Link> override_link)
    : procs_(std::move(procs)),
      self_(std::move(self)),
      frames_(std::move(host)),
      single_copy_(frames_, std::move(description)),
      override_(std::move(override_link)),
      placements_(new std::atomic<uint8_t>[procs_.size()]) {
  for (size_t r = 0; r < procs_.size(); ++r) placements_[r].store(0, std::memory_order_relaxed);
}

Placement Selector::placement(int dest) {
  const uint8_t known = placements_[dest].load(std::memory_order_relaxed);
  if (known != 0) return static_cast<Placement>(known - 1);
  const ProcId& proc = procs_[dest];
  const Placement p = proc == self_                       ? Placement::kSameProcess
                      : platform::proc_on_this_host(proc) ? Placement::kSameHost
                                                          : Placement::kOtherHost;
  placements_[dest].store(static_cast<uint8_t>(p) + 1, std::memory_order_relaxed);
  return p;
}

Route Selector::route(int dest, size_t bytes) {
  const Placement where = placement(dest);
  if (where != Placement::kSameProcess && override_ != nullptr) {
    return Route{override_.get(), override_->capabilities()};
  }
  // What a communicator can use: its process, single copy where enabled,
  // and frames (ring or socket: FrameLink decides, in band, for order).
  Available available{Path::kInProcess, Path::kShmRing, Path::kSocket};
  if (single_copy_enabled()) available.add(Path::kSingleCopy);
  switch (*choose(where, bytes, available)) {  // kSocket serves every peer: never nullopt
    case Path::kInProcess: return Route{&InProcessLink::instance(), InProcessLink::instance().capabilities()};
    case Path::kSingleCopy: return Route{&single_copy_, single_copy_.capabilities()};
    default: return Route{&frames_, frames_.capabilities()};
  }
}

Path Selector::path(int dest, size_t bytes) { return route(dest, bytes).link->path(procs_[dest]); }

void Selector::abandon_send(const std::shared_ptr<detail::RequestState>& request) {
  if (override_ != nullptr) return override_->abandon_send(request);
  single_copy_.abandon_send(request);  // waits when the request is not one of its offers
}

void Selector::peer_lost(const ProcId& proc, const absl::Status& why) {
  single_copy_.peer_lost(proc, why);
  if (override_ != nullptr) override_->peer_lost(proc, why);
}

struct PollScope::Held {
  ShmPollScope rings;
};

PollScope::PollScope() : held_(std::make_unique<Held>()) {}
PollScope::~PollScope() = default;

}  // namespace castmesh::link
