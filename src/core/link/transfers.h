// One-sided operations in flight on the links (Link::start): what this
// process started on a registered Region of another proc (an RDMA buffer's
// read, write or release), from the first message to their one completion.
//
// A Transfer names no path: it carries the Region (everything any link
// needs to reach the remote memory) and its routes, the links to try in
// order (the selector's choice first, then what the cost table allows when
// a link finds its path refused: start_next). A link keeps its own state
// for the transfer in `link_state`.
//
// A Transfer completes exactly once: with its result, its error, a timeout,
// or the loss of the owner proc. Bytes reach a read's destination only
// under the transfer's lock and only before it completed, so a destination
// is never written after its operation reported a failure (no late bytes).
//
// Thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "castmesh/detail/mutex.h"
#include "castmesh/rdma.h"
#include "core/link/link.h"
#include "core/scheduler/timer_queue.h"

namespace castmesh::proc {
class ProcHost;
}

namespace castmesh::link {

// A link's own state for one transfer (the shared segment's window).
struct TransferState {
  virtual ~TransferState() = default;
};

// The links a transfer tries, in order: at most one per row of the cost
// table and one more, held inline (an operation allocates nothing for them).
class Routes {
 public:
  static constexpr size_t kMax = 8;
  Routes() = default;
  Routes(std::initializer_list<Link*> links) {
    for (Link* link : links) push_back(link);
  }
  // Appends `link` (beyond kMax it is dropped: no table is that long).
  void push_back(Link* link) {
    if (size_ < kMax) links_[size_++] = link;
  }
  bool empty() const { return next_ == size_; }
  // The next link (not empty()).
  Link* front() const { return links_[next_]; }
  // Takes the next link (not empty()).
  Link* pop_front() { return links_[next_++]; }

 private:
  std::array<Link*, kMax> links_{};
  size_t next_ = 0;
  size_t size_ = 0;
};

// One operation on another proc's registered memory.
struct Transfer {
  uint64_t id = 0;
  Region remote;         // the owner's registration (remote.owner, remote.id, ...)
  bool write = false;
  bool release = false;  // a RELEASE request, not a data operation
  uint64_t offset = 0;   // in the owner's buffer
  size_t length = 0;
  TensorView local;      // read: destination, write: source (kept alive)
  char* bytes = nullptr;  // local.data()
  // The path the result reports: set by the link that carries it (start()).
  RdmaTransport transport = RdmaTransport::kSocket;
  // The links still to try after the current one, in order (start_next
  // takes the first). Read only by the one link that holds the transfer.
  Routes routes;
  std::weak_ptr<proc::ProcHost> host;  // the proc that sends
  std::function<void(absl::StatusOr<RdmaResult>)> done;  // called once, by Transfers::finish

  // The carrying link's state, set (under mu) before its first message goes
  // and never reset, so handlers of the answers read it freely.
  std::shared_ptr<TransferState> link_state;

  detail::Mutex mu;
  size_t moved ABSL_GUARDED_BY(mu) = 0;
  bool finished ABSL_GUARDED_BY(mu) = false;
  // Run once by Transfers::finish, outside the lock, before `done`
  // (argument: whether the operation succeeded).
  std::function<void(bool ok)> cleanup ABSL_GUARDED_BY(mu);
  uint64_t timer = 0;  // set by Transfers::start
};

// Starts `transfer` (tracked by Transfers) on its next route: the link that
// carries it, or the next one when a link finds its path refused or
// unusable (it calls this again). With no route left the transfer fails.
// The thread that holds the transfer.
void start_next(const std::shared_ptr<Transfer>& transfer);

class Transfers {
 public:
  // The process's table (leaked: I/O threads may use it during exit).
  static Transfers& instance();

  // A fresh operation number.
  uint64_t next_id();
  // Tracks `transfer` until it finishes; fails it after `timeout`.
  void start(const std::shared_ptr<Transfer>& transfer, absl::Duration timeout);
  // The unfinished transfer `id`, or nullptr.
  std::shared_ptr<Transfer> find(uint64_t id);
  // Completes `transfer` with `result` unless it already completed.
  void finish(const std::shared_ptr<Transfer>& transfer, absl::StatusOr<RdmaResult> result);
  // Copies bytes the owner sent for [offset, offset+size) into a read's
  // destination; finishes the read once every byte is there.
  void deliver(const std::shared_ptr<Transfer>& transfer, uint64_t offset, const char* body, size_t size);
  // Runs `copy` (a single copy into or out of the owner's memory) under the
  // transfer's lock, unless it already completed: then false, nothing ran.
  bool copy_if_live(const std::shared_ptr<Transfer>& transfer, const std::function<absl::Status()>& copy,
                    absl::Status* copied);
  // Fails every transfer to `owner` (its proc was lost).
  void owner_lost(const ProcId& owner, const absl::Status& why);

 private:
  detail::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Transfer>> live_ ABSL_GUARDED_BY(mu_);
  detail::TimerQueue timers_;
};

}  // namespace castmesh::link
