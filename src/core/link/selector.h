// The selector: which link carries an operation to a peer, from where the
// peer is (this process, this host, elsewhere), the operation's size, what
// this process can use now, and one cost table (kCostTable below; the
// measurements behind each row are in docs/architecture.md, "Link layer").
//
// choose() is the rule, a pure function (tests/core/link/selector_test.cc);
// Selector applies it for one communicator rank, owning the links it
// routes to. Every route names its path, which operations report
// (collectives per step at debug level, RDMA in its result).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "castmesh/address.h"
#include "core/link/frame_link.h"
#include "core/link/in_process_link.h"
#include "core/link/link.h"
#include "core/link/single_copy.h"
#include "core/link/single_copy_link.h"

namespace castmesh::link {

// Where a peer proc is, seen from this process.
enum class Placement : uint8_t { kSameProcess, kSameHost, kOtherHost };

// One row of the cost table: `path` serves peers at `reach` (kSameHost
// rows serve only peers of this host; kOtherHost rows serve every peer
// outside this process) for operations of at least `min_bytes`. Rows are in
// order of preference: the first row that applies and whose path is
// available wins.
struct CostRow {
  Path path;
  Placement reach;
  size_t min_bytes;
};

// The cost table (docs/architecture.md, "Link layer", gives each row's
// measured reason).
inline constexpr CostRow kCostTable[] = {
    // An RDMA NIC moves bytes without either CPU, at any size.
    {Path::kIbverbs, Placement::kOtherHost, 0},
    // Both ranks here: one memcpy into the receive.
    {Path::kInProcess, Placement::kSameProcess, 0},
    // Same host, large: the bytes cross memory once (process_vm_readv/writev);
    // below 64 KiB the offer's round trip costs more than the copies it saves.
    {Path::kSingleCopy, Placement::kSameHost, kSingleCopyMinBytes},
    // Same host, large, where the kernel refuses cross-memory copies: RDMA
    // buffers map a shared segment (two copies, no socket).
    {Path::kSharedSegment, Placement::kSameHost, kSingleCopyMinBytes},
    // Same host: a ring record (two memcpys, at most one futex wake).
    {Path::kShmRing, Placement::kSameHost, 0},
    // Anything else: the procs' connection (large bodies written in place).
    {Path::kSocket, Placement::kOtherHost, 0},
};

// The paths this process can use towards one peer now, as a bit set.
class Available {
 public:
  Available() = default;
  Available(std::initializer_list<Path> paths) {
    for (Path p : paths) add(p);
  }
  void add(Path p) { bits_ |= bit(p); }
  void remove(Path p) { bits_ &= ~bit(p); }
  bool has(Path p) const { return (bits_ & bit(p)) != 0; }

 private:
  static uint32_t bit(Path p) { return uint32_t{1} << static_cast<unsigned>(p); }
  uint32_t bits_ = 0;
};

// The first row of kCostTable that serves a peer at `placement` for
// `bytes` and whose path is in `available`; nullopt when none does.
std::optional<Path> choose(Placement placement, size_t bytes, const Available& available);
// Every row of kCostTable that serves a peer at `placement` for `bytes` and
// whose path is in `available`, in the table's order (the first is
// choose()'s, the others where an operation goes when a path refuses it),
// written to `out` (room for std::size(kCostTable)); returns how many.
size_t choose_in_order(Placement placement, size_t bytes, const Available& available, Path* out);

// Where one operation goes: the link, its capabilities, and the path.
struct Route {
  Link* link = nullptr;
  Capabilities caps;
};

// The links of one communicator rank and the rule between them. Thread-safe;
// route() is on every send's path (no lock, no allocation).
class Selector {
 public:
  // `procs[r]` is rank r's proc, `self` this process's; `host` the proc's
  // transport (frames, offers); `description` names the communicator in
  // errors. `override_link` (tests: FakeLink) carries every message to a
  // rank outside this process instead of the real links.
  Selector(std::vector<ProcId> procs, ProcId self, std::weak_ptr<proc::ProcHost> host, std::string description,
           std::shared_ptr<Link> override_link = nullptr);

  // The link for `bytes` bytes to rank `dest` (0 <= dest < size). Any thread.
  Route route(int dest, size_t bytes);
  // The path route(dest, bytes) takes now (for reports: may take a lock).
  Path path(int dest, size_t bytes);
  // Where rank `dest` is (decided once per rank, from its proc's address).
  Placement placement(int dest);

  // The single-copy offers' answers (Exchange, on an I/O or ring thread).
  void on_single_copy_answer(uint64_t token, bool fallback) { single_copy_.on_answer(token, fallback); }
  // The link that carried `request` stops reading its buffer
  // (Link::abandon_send). The sending thread.
  void abandon_send(const std::shared_ptr<detail::RequestState>& request);
  // Proc `proc` is lost: every link's sends to it fail with `why`.
  void peer_lost(const ProcId& proc, const absl::Status& why);

 private:
  const std::vector<ProcId> procs_;
  const ProcId self_;
  FrameLink frames_;
  SingleCopyLink single_copy_;
  const std::shared_ptr<Link> override_;
  // Per rank: 0 unknown, else 1 + Placement.
  std::unique_ptr<std::atomic<uint8_t>[]> placements_;
};

// Held by a thread for the whole of a large collective that alternates
// between waiting on its links and computing: records arriving on this
// process's inbound shared-memory rings meanwhile wait for this thread's
// next wait instead of waking the progress thread (which would take a core
// from the ranks themselves). The thread that holds it.
class PollScope {
 public:
  PollScope();
  ~PollScope();
  PollScope(const PollScope&) = delete;
  PollScope& operator=(const PollScope&) = delete;

 private:
  struct Held;
  std::unique_ptr<Held> held_;
};

}  // namespace castmesh::link
